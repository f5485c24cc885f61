"""The agents check's verdicts: a context-limit 400 the agent recovered from is no fault, any
other refusal is; reuse is judged on the first prompt of the new and the resumed session."""

from __future__ import annotations

import json

from bench.agents.recorder import Exchange, Recorder
from bench.agents.report import checks
from bench.agents.sessions import Session
from bench.agents.usage import SseReader, Usage

LIMIT = "input length and `max_tokens` exceed context limit: 19639 + 32000 > 32768, decrease input length"


def _call(
    label: str, status: int = 200, prompt: int = 1000, cached: int = 0, tools: int = 1, error: str = ""
) -> Exchange:
    answer = json.dumps({"type": "error", "error": {"message": error}}).encode() if status >= 400 else b""
    usage = Usage(prompt, cached, tools) if status < 400 else Usage()
    return Exchange(label, "POST", "/v1/messages", status=status, usage=usage, answer=answer)


def _verdicts(calls: list[Exchange]) -> dict[str, bool]:
    recorder = Recorder("http://127.0.0.1:1")
    recorder.exchanges = calls
    sessions = [Session(f"a/{kind}", kind, 0, 1.0, "") for kind in ("fresh", "new", "resumed")]
    return {c.name: c.passed for c in checks(recorder, sessions, min_tool_calls=2)}


def test_a_recovered_context_limit_is_no_fault_another_400_is() -> None:
    calls = [
        _call("a/fresh", 400, error=LIMIT),
        _call("a/fresh", cached=0),
        _call("a/fresh", cached=900),
        _call("a/new", 400, error=LIMIT),  # NOTE: judged on the first answered prompt, next
        _call("a/new", cached=950),
        _call("a/new", 400, error="tools of type `namespace` are not supported"),
        _call("a/new", cached=990),
        _call("a/resumed", cached=899),
        _call("a/resumed", 400, error=LIMIT),
    ]
    verdicts = _verdicts(calls)
    assert verdicts == {
        "a/fresh: every request answered": True,
        "a/fresh: >= 2 tool calls": True,
        "a/new: every request answered": False,  # NOTE: not a context limit, whatever follows
        "a/new: first prompt >= 90 % cached": True,
        "a/resumed: every request answered": False,  # NOTE: the last word: nothing recovered
        "a/resumed: first prompt >= 90 % cached": False,
        "a/resumed: >= 2 tool calls": False,
    }


def test_sse_split_anywhere_reads_anthropic_usage_and_tool_calls() -> None:
    events = [
        {
            "type": "message_start",
            "message": {
                "usage": {
                    "input_tokens": 10,
                    "cache_read_input_tokens": 900,
                    "cache_creation_input_tokens": 90,
                }
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "name": "Read"}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 90,
                "output_tokens": 5,
            },
        },
    ]
    stream = b"".join(f"event: {e['type']}\r\ndata: {json.dumps(e)}\r\n\r\n".encode() for e in events)
    usage = Usage()
    reader = SseReader(usage)
    for i in range(0, len(stream), 7):
        reader.feed(stream[i : i + 7])
    assert (usage.prompt, usage.cached, usage.tool_calls, usage.ended) == (1000, 900, 1, "tool_use")
