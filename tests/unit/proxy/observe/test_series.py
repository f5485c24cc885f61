"""The dashboard's TTFT series: per minute by cache outcome, and binned by cached-prefix length."""

from __future__ import annotations

import time
from dataclasses import asdict

from proxy.observe.records import RequestLog, RequestRecord
from proxy.observe.series import (
    CACHED_TOKEN_BINS,
    PROMPT_TOKEN_BINS,
    ttft_by_cached_tokens,
    ttft_by_prompt_tokens,
    ttft_per_minute,
)
from proxy.observe.usage import UsageHistory

T0 = 1_700_000_040  # the start of a minute (a multiple of 60)


def test_ttft_per_minute_medians_by_outcome() -> None:
    """Requests fall into the minute of their first token; each outcome gets its own median."""
    rows = ttft_per_minute(
        [
            (T0 + 1, "hit", 0.1),
            (T0 + 59.9, "hit", 0.3),
            (T0 + 30, "miss", 2.0),
            (T0 + 30, "hit", 0.2),
            (T0 + 180, "partial", 1.0),
        ]
    )
    assert [asdict(r) for r in rows] == [
        {
            "minute": T0,
            "hit": {"count": 3, "p50": 0.2},
            "partial": {"count": 0, "p50": None},
            "miss": {"count": 1, "p50": 2.0},
        },
        {
            "minute": T0 + 180,
            "hit": {"count": 0, "p50": None},
            "partial": {"count": 1, "p50": 1.0},
            "miss": {"count": 0, "p50": None},
        },
    ]
    assert ttft_per_minute([]) == []


def test_ttft_by_cached_tokens_lists_every_bin() -> None:
    """Bin edges are inclusive; nothing cached is a bin of its own; the last bin is unbounded."""
    rows = [
        asdict(r)
        for r in ttft_by_cached_tokens([(0, 3.0), (0, 1.0), (128, 0.5), (255, 0.7), (256, 0.4), (9000, 0.2)])
    ]
    assert [(r["min_tokens"], r["max_tokens"]) for r in rows] == list(CACHED_TOKEN_BINS)
    assert [(r["count"], r["p50"]) for r in rows] == [
        (2, 2.0),
        (2, 0.6),
        (1, 0.4),
        (0, None),
        (0, None),
        (0, None),
        (1, 0.2),
    ]


def test_usage_history_skips_failed_reads() -> None:
    """Each sample keeps the time, blocks and bytes read; a read that fails (None) is skipped."""
    reads = iter([(3, 300), None, (5, 500)])
    history = UsageHistory(lambda: next(reads))
    for _ in range(3):
        history.sample()
    assert [(p.blocks, p.bytes) for p in history.points()] == [(3, 300), (5, 500)]


def test_ttft_percentiles_stay_within_the_observed_times() -> None:
    """Two misses of 1 s and 24 s: p95 lies between them (no extrapolation past the slowest)."""
    log = RequestLog()
    for ttft in (1.0, 24.0):
        log.add(RequestRecord(time.time(), "ns", 100, 0, ttft, "miss", None, ttft, 0.0))
    miss = log.summary(None).ttft_seconds["miss"]
    assert miss.count == 2 and 1.0 <= miss.p50 <= miss.p95 <= 24.0


def test_ttft_by_prompt_tokens_keeps_outcomes_apart_per_length() -> None:
    """A long hit and short misses land in different bins: each outcome's median per length."""
    rows = [
        asdict(r)
        for r in ttft_by_prompt_tokens(
            [(2000, "hit", 0.2), (2000, "miss", 4.0), (100, "miss", 0.3), (100, "miss", 0.5)]
        )
    ]
    assert [(r["min_tokens"], r["max_tokens"]) for r in rows] == list(PROMPT_TOKEN_BINS)
    short, long = rows[0], rows[3]
    assert (short["miss"], short["hit"]["count"]) == ({"count": 2, "p50": 0.4}, 0)
    assert long["hit"] == {"count": 1, "p50": 0.2} and long["miss"] == {"count": 1, "p50": 4.0}
