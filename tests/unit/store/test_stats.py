"""store/stats.py: one stats type, recorded from any thread, read as a snapshot."""

from __future__ import annotations

import threading

import pytest

from store.stats import CacheStats, StatsRecorder


def test_snapshots_do_not_move_and_add_up_across_threads() -> None:
    recorder = StatsRecorder()
    before = recorder.snapshot()

    def work() -> None:
        for _ in range(1000):
            recorder.add(lookups=1, tokens_queried=300, tokens_hit=256)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = recorder.snapshot(ram_tier_bytes=42)
    assert before == CacheStats()
    assert (after.lookups, after.tokens_queried, after.ram_tier_bytes) == (4000, 1_200_000, 42)
    assert after.hit_rate == 256 / 300 and CacheStats().hit_rate is None


def test_evictions_by_reason_and_unknown_counters() -> None:
    stats = CacheStats(
        evicted_ttl=1, evicted_budget=2, verification_failures=3, evicted_gc=4, evicted_orphan=5
    )
    assert stats.evictions == {"ttl": 1, "budget": 2, "verification_failure": 3, "gc": 9, "audit": 0}
    with pytest.raises(KeyError):
        StatsRecorder().add(no_such_counter=1)
