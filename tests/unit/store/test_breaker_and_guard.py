"""store/breaker.py and store/guard.py: after a Redis failure nobody waits on Redis for a while."""

from __future__ import annotations

import time

import redis

from store.breaker import CircuitBreaker
from store.guard import Guard
from store.stats import StatsRecorder


def test_the_breaker_opens_once_and_lets_a_probe_through_after_the_cooldown() -> None:
    breaker = CircuitBreaker(cooldown_s=0.05)
    assert breaker.allow()
    assert breaker.failure() is True and breaker.failure() is False  # opened once
    assert not breaker.allow()
    time.sleep(0.06)
    assert breaker.allow()  # a probe
    assert breaker.success() is True and breaker.success() is False


def test_a_guarded_failure_is_none_counted_and_skips_redis_until_the_cooldown() -> None:
    recorder = StatsRecorder()
    guard = Guard(cooldown_s=60, stats=recorder)
    calls = []

    def fails() -> int:
        calls.append(1)
        raise redis.ConnectionError("refused")

    assert guard.redis("match", fails) is None
    assert guard.redis("match", fails) is None  # the breaker is open: not even tried
    assert len(calls) == 1 and recorder.snapshot().redis_errors == 1
    assert not guard.allow()
