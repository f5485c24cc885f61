"""``SharedCounts``: counts on their way to the deployment-wide counters (``store.index.base``'s
``Counters``).

Every lookup, save and eviction adds a few counts. They are merged here by scope (the deployment,
or one namespace) and name, and the writer thread adds them to Redis in one flush. A busy writer
or an unreachable Redis only delays them: they wait here (one integer per scope and name) until a
flush succeeds, so the deployment's totals come to the sum of what its processes counted.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable

from store.guard import Guard
from store.index.base import Counters

MAX_EXTRAS = 1024
"""Other statistics (e.g. a hot prefix's hit) waiting for a flush; beyond it the oldest are
dropped: they are samples of the traffic, not totals."""

Scope = str | None
"""The hex digest of a namespace, or None: the deployment alone."""


class SharedCounts:
    """Counts (and other statistics) waiting for the writer thread, which ``flush``es them to
    ``counters`` through ``guard`` (the counters' breaker). Thread-safe.

    Args:
        counters: the deployment-wide counters.
        guard: the breaker their Redis calls go through.
    """

    def __init__(self, counters: Counters, guard: Guard) -> None:
        self.counters, self.guard = counters, guard
        self._lock = threading.Lock()
        self._counts: dict[Scope, Counter[str]] = {}
        self._extras: deque[Callable[[], object]] = deque(maxlen=MAX_EXTRAS)
        self._queued = False

    def add(self, scope: Scope, counts: dict[str, int], also: Callable[[], object] | None = None) -> bool:
        """Add ``counts`` (and the statistic ``also`` records); True when the caller should queue a
        ``flush`` (none is queued yet)."""
        with self._lock:
            self._counts.setdefault(scope, Counter()).update({k: v for k, v in counts.items() if v})
            if also is not None:
                self._extras.append(also)
            queue, self._queued = not self._queued, True
            return queue

    def unqueued(self) -> None:
        """The flush the last ``add`` asked for could not be queued: the next ``add`` asks again."""
        with self._lock:
            self._queued = False

    @property
    def waiting(self) -> bool:
        """Whether counts or statistics wait for a flush."""
        with self._lock:
            return any(self._counts.values()) or bool(self._extras)

    def flush(self) -> None:
        """Add every scope's counts to the counters (those Redis does not take wait for the next
        flush) and record every statistic."""
        with self._lock:
            taken, self._counts = self._counts, {}
            extras = list(self._extras)
            self._extras.clear()
            self._queued = False
        failed = {scope: counts for scope, counts in taken.items() if counts and not self._add(scope, counts)}
        for extra in extras:
            self.guard.redis("stats", extra)
        if failed:
            with self._lock:
                for scope, counts in failed.items():
                    self._counts.setdefault(scope, Counter()).update(counts)

    def _add(self, scope: Scope, counts: Counter[str]) -> bool:
        def add() -> bool:
            self.counters.add(scope, dict(counts))
            return True

        return self.guard.redis("stats", add) is not None
