"""``StoreAdmin``: the administrative side of a cache (``CacheAdmin``), which needs no model.

The command line's ``kvproxy cache stats|gc|clear`` use it as it is; the serving cache
(``store.cache.BlockCache``) extends it with lookups, saves and a RAM tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache, partial
from typing import Any

from hashing import Namespace, block_hashes
from store import report
from store.admin_interface import CacheHealth
from store.blob_backend import BlobBackend
from store.gc import GarbageCollector, clear, collect
from store.guard import Guard
from store.hot import open_hot
from store.parts import BlockIndex
from store.stats import CacheStats, GcReport, StatsRecorder


class StoreAdmin:
    """Health, statistics, explanations, garbage collection and clearing of one index and blob
    store (implements ``CacheAdmin``; see there for each method's contract).

    Args:
        index: the Redis index.
        blobs: the blob store.
        breaker_cooldown_s: how long to skip Redis after it failed.
        gc_grace_s: seconds a blob without an index entry is kept before collection.
    """

    def __init__(
        self,
        index: BlockIndex,
        blobs: BlobBackend,
        *,
        breaker_cooldown_s: float = 5.0,
        gc_grace_s: float = 60.0,
    ) -> None:
        self.index, self.blobs, self.gc_grace_s = index, blobs, gc_grace_s
        self.counters = index.shared_counters()
        self.recorder = StatsRecorder()
        self.guard = Guard(breaker_cooldown_s, self.recorder)
        # NOTE: the deployment-wide counters have a breaker of their own: on a Redis Cluster they
        # may live on another node than a namespace's blocks, whose lookups must not stop with them.
        self.stats_guard = Guard(breaker_cooldown_s, self.recorder)
        self.hot = open_hot(index)
        # NOTE: the hot prefixes' text is read from block 0's blob once: a hash names its tokens for good
        self.root_tokens = lru_cache(maxsize=256)(partial(report.root_tokens, blobs))
        self._collector: GarbageCollector | None = None

    def health(self) -> CacheHealth:
        """Pings Redis when the breaker lets a probe through."""
        return "ok" if self.guard.redis("ping", self._ping) else "degraded"

    def _ping(self) -> bool:
        self.index.ping()
        return True

    def stats(self) -> CacheStats:
        return self.recorder.snapshot()

    def usage(self) -> tuple[int, int] | None:
        return self.guard.redis("stats", lambda: (self.index.num_blocks(), self.index.total_bytes()))

    def deployment_stats(self, namespace: Namespace | None = None) -> dict[str, Any] | None:
        return self.stats_guard.redis("stats", report.deployment_stats, self.counters, self.index, namespace)

    def timeline(self, namespace: Namespace | None = None, minutes: int = 60) -> list[dict[str, Any]] | None:
        return self.stats_guard.redis("stats", report.timeline, self.counters, namespace, minutes)

    def hot_prefixes(
        self, namespace: Namespace | None = None, readable: Namespace | None = None, n: int = 10
    ) -> list[dict[str, Any]] | None:
        if self.hot is None:
            return None
        args = (self.hot, self.root_tokens, namespace, readable, n)
        return self.stats_guard.redis("stats", report.hot_prefixes, *args)

    def tenant_rates(self, known: Sequence[Namespace] = ()) -> list[dict[str, Any]] | None:
        known_hex = [ns.hex() for ns in known]
        return self.stats_guard.redis("stats", report.tenant_rates, self.counters, self.hot, known_hex)

    def divergence(
        self, namespace: Namespace, token_ids: Sequence[int], block: int
    ) -> tuple[int, list[int]] | None:
        args = (self.index, self.blobs, namespace, token_ids, block)
        return self.guard.redis("children", report.divergence, *args)

    def indexed_blocks(self, namespace: Namespace, token_ids: Sequence[int]) -> int | None:
        hashes = block_hashes(token_ids, namespace)
        missing = self.guard.redis("exists", self.index.missing, namespace, hashes, scope=namespace.hex())
        return None if missing is None else next((i for i, gone in enumerate(missing) if gone), len(hashes))

    def gc(self, grace_s: float | None = None) -> GcReport | None:
        """One collection (``store.gc``); None when Redis is unreachable."""
        grace = self.gc_grace_s if grace_s is None else grace_s
        found = self.guard.redis("gc", collect, self.index, self.blobs, grace)
        if found is not None:
            counts = {
                "evicted_ttl": found.expired,
                "evicted_orphan": found.orphans,
                "evicted_gc": found.missing_blobs + found.unindexed_blobs,
            }
            self.recorder.add(**counts)
            self.share(None, **counts)
        return found

    def clear(self, namespace_hex: str | None = None) -> int:
        return clear(self.index, self.blobs, namespace_hex)

    def share(self, namespace: Namespace | None = None, **counts: int) -> None:
        """Add to the deployment-wide counters (and the namespace's) now."""
        scope = namespace.hex() if namespace is not None else None
        self.stats_guard.redis("stats", self.counters.add, scope, counts)

    def start_gc(self, interval_s: float) -> None:
        """Collect garbage every ``interval_s`` seconds on a daemon thread (until ``close``)."""
        if self._collector is None:
            self._collector = GarbageCollector(self.gc, interval_s)

    def close(self) -> None:
        """Stop the garbage collector."""
        if self._collector is not None:
            self._collector.stop()
            self._collector = None
