"""The deployment-wide counters add up to what was counted, however far behind the writer falls and
whatever Redis does meanwhile: counts wait in the process (``store.counts``) until Redis takes them."""

from __future__ import annotations

import threading

from store.counts import SharedCounts
from store.guard import Guard
from store.index.redis.connect import redis_client
from store.index.redis.counters import SharedCounters
from store.stats import StatsRecorder
from tests.helpers import HANG_S, NS, SPEC, RedisServer, free_port, wait_for


def test_counts_wait_for_a_stopped_redis_and_then_add_up(key_prefix) -> None:
    """Redis stops: flushes fail and the counts wait; it comes back (empty: it keeps nothing on
    disk here): the next flush adds every count made meanwhile."""
    server = RedisServer(free_port()).start()
    try:
        counters = SharedCounters(redis_client(server.url, 1.0), key_prefix)
        shared = SharedCounts(counters, Guard(0.0, StatsRecorder()))
        server.stop()
        for _ in range(3):
            shared.add(NS.hex(), {"prompt_tokens": 10, "cached_tokens": 5})
            shared.flush()
        assert shared.waiting
        server.start()
        shared.flush()
        assert not shared.waiting
        assert counters.totals() == counters.totals(NS.hex()) == {"prompt_tokens": 30, "cached_tokens": 15}
    finally:
        server.stop()


def test_a_full_writer_queue_delays_counts_and_never_drops_them(make_cache, redis_client, key_prefix) -> None:
    """The writer held up and its queue full: 200 lookups' counts are merged meanwhile, and are all
    in the totals once it runs again (with no further request to carry them)."""
    cache = make_cache(SPEC, max_pending_saves=1)
    writer, release = cache.writer, threading.Event()
    assert writer.enqueue(release.wait) and wait_for(
        lambda: writer.enqueue(release.wait), HANG_S, "a queued job"
    )
    assert not writer.enqueue(release.wait)  # full
    for _ in range(200):
        writer.share(NS, prompt_tokens=3, cached_tokens=2)
    release.set()
    counters = SharedCounters(redis_client, key_prefix)
    expected = {"prompt_tokens": 600, "cached_tokens": 400}

    def added() -> bool:
        totals = counters.totals()
        return {k: totals.get(k, 0) for k in expected} == expected

    wait_for(added, HANG_S, "the merged counts in the deployment's totals")
    assert {k: counters.totals(NS.hex()).get(k, 0) for k in expected} == expected
