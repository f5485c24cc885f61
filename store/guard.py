"""How the cache's parts meet faults: Redis calls through a circuit breaker, warnings once per burst.

Every part of the cache (lookup, writer, collector, administration) calls Redis through one
``Guard``, so one failure anywhere opens the breaker for all of them, is counted once and logged
once; while the breaker is open nobody waits on Redis (a miss costs nothing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from store.breaker import CircuitBreaker
from store.index.redis.connect import REDIS_ERRORS
from store.index.redis.faults import RedisPlace, redis_fault
from store.stats import StatsRecorder

log = logging.getLogger("store")
T = TypeVar("T")

WARN_EVERY_S = 60.0


class Guard:
    """A circuit breaker for the Redis index plus rate-limited warnings.

    Operations on one namespace's keys (a lookup, a publish) go through a breaker of that
    namespace (``scope``): on a Redis Cluster a namespace lives on one node, and a node that goes
    away must not stop the lookups of namespaces on the others. Everything else (eviction, the
    collector, health) goes through the breaker of the whole index.

    Args:
        cooldown_s: how long to skip Redis after it failed.
        stats: where Redis failures are counted (``redis_errors``).
        place: the Redis's URL and timeout, for the warnings (``store.index.redis.faults``).
        warned: when each kind of warning was last logged (monotonic seconds), shared by the guards
            of one Redis so that one fault is said once, whichever guard meets it first.
    """

    def __init__(
        self,
        cooldown_s: float,
        stats: StatsRecorder,
        place: RedisPlace | None = None,
        warned: dict[str, float] | None = None,
    ) -> None:
        self.breaker = CircuitBreaker(cooldown_s)
        self.stats = stats
        self.place = place or RedisPlace()
        self._scoped: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()
        self._last_warning = {} if warned is None else warned

    def allow(self) -> bool:
        """Whether Redis may be tried now (the whole index's breaker)."""
        return self.breaker.allow()

    def redis(
        self, operation: str, fn: Callable[..., T], *args: object, scope: str | None = None
    ) -> T | None:
        """``fn(*args)``, or None when the breaker (of ``scope``, a namespace, or of the whole
        index) is open or Redis fails (which opens it)."""
        breaker = self._breaker(scope)
        if not breaker.allow():
            return None
        try:
            result = fn(*args)
        except REDIS_ERRORS as exc:
            self.failed(operation, exc, breaker)
            return None
        self.succeeded(breaker)
        return result

    def _breaker(self, scope: str | None) -> CircuitBreaker:
        if scope is None:
            return self.breaker
        with self._lock:
            return self._scoped.setdefault(scope, CircuitBreaker(self.breaker.cooldown_s))

    def failed(self, operation: str, exc: Exception, breaker: CircuitBreaker | None = None) -> None:
        """Count a Redis failure and open the breaker (logged when it opens, once a minute at
        most, saying whether Redis was too slow or is not there: ``redis_fault``)."""
        self.stats.add(redis_errors=1)
        if (breaker or self.breaker).failure():
            self.warn(
                "redis",
                "Redis index failed during %s: %s. Serving uncached; caching resumes on its own when "
                "Redis answers.",
                operation,
                redis_fault(exc, self.place),
            )

    def succeeded(self, breaker: CircuitBreaker | None = None) -> None:
        """Close the breaker after a successful call (logged when the whole index's was open)."""
        if (breaker or self.breaker).success() and breaker in (None, self.breaker):
            log.info("Redis index answers again: caching resumed")

    def warn(self, kind: str, message: str, *args: object) -> None:
        """Log a warning at most once per ``WARN_EVERY_S`` seconds per kind (one per burst)."""
        now = time.monotonic()
        if now - self._last_warning.get(kind, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._last_warning[kind] = now
            log.warning(message, *args)
