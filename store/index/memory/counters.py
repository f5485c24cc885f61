"""Deployment-wide counters in this process's memory (``memory://``): the contract of
``store.index.base.Counters``, with the bucket layout of ``store.index.redis.counters``."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

from store.index.base import BUCKET_S, KEEP_S, Window


class MemoryCounters:
    """``Counters`` in memory: totals, and tokens queried and hit per 10-second bucket
    for the last hour (the layout of ``store.index.redis.counters``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._totals: dict[str | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._buckets: dict[tuple[str | None, int], list[int]] = defaultdict(lambda: [0, 0])
        self._lock = threading.Lock()

    def add(self, namespace_hex: str | None, counts: dict[str, int]) -> None:
        bucket = int(self.clock()) // BUCKET_S
        with self._lock:
            for scope in {None, namespace_hex}:
                for name, delta in counts.items():
                    self._totals[scope][name] += delta
                if counts.get("prompt_tokens"):
                    window = self._buckets[scope, bucket]
                    window[0] += counts["prompt_tokens"]
                    window[1] += counts.get("cached_tokens", 0)
            for key in [k for k in self._buckets if k[1] < bucket - KEEP_S // BUCKET_S]:
                del self._buckets[key]

    def totals(self, scope: str | None = None) -> dict[str, int]:
        with self._lock:
            return dict(self._totals[scope])

    def buckets(self, scope: str | None, seconds: int) -> list[tuple[int, Window]]:
        now = int(self.clock()) // BUCKET_S
        with self._lock:
            found = {
                b: self._buckets.get((scope, b), [0, 0])
                for b in range(now - seconds // BUCKET_S + 1, now + 1)
            }
        return [(b * BUCKET_S, Window(q, h)) for b, (q, h) in found.items()]

    def window(self, scope: str | None, seconds: int) -> Window:
        windows = [w for _, w in self.buckets(scope, seconds)]
        return Window(sum(w.queried for w in windows), sum(w.hit for w in windows))
