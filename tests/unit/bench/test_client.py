"""bench/client.py: server-sent events are parsed as OpenAI sends them; summaries add up."""

from __future__ import annotations

import pytest

from bench.client import BenchError, Result, _events, summarize


def test_events_stop_at_done_and_errors_raise() -> None:
    lines = [
        'data: {"choices": [{"delta": {"content": "Hi"}}]}',
        "",
        ": keep-alive",
        "data: [DONE]",
        "data: {}",
    ]
    assert list(_events(iter(lines))) == [{"choices": [{"delta": {"content": "Hi"}}]}]
    with pytest.raises(BenchError, match="error in the stream"):
        list(_events(iter(['data: {"error": {"message": "boom"}}'])))


def test_summaries_are_sums_of_the_servers_usage() -> None:
    results = [Result(0.5, 1.0, 300, 0, 10), Result(0.1, 0.6, 300, 256, 10)]
    s = summarize("w", results, wall_s=2.0)
    assert (s.requests, s.prompt_tokens, s.cached_tokens, s.output_tokens_per_s) == (2, 600, 256, 10.0)
    assert s.hit_rate == 256 / 600 and s.ttft_p50_s == pytest.approx(0.3)
