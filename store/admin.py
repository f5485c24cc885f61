"""``StoreAdmin``: the administrative side of a cache (``CacheAdmin``).

Alone (no model, no writer) it is what the command line's ``kvproxy cache stats|gc|clear`` use;
the serving cache (``store.cache.BlockCache``) holds one with its writer and K/V layout, which
adds snapshots and keeps the byte budget after a collection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache, partial
from time import monotonic
from typing import IO, TypeVar

from hashing import BLOCK_SIZE, BlockHash, Namespace, NamespaceIdentity, block_hashes, tail_hash
from store import report
from store.admin_interface import (
    CacheHealth,
    DeploymentStats,
    HotPrefixRow,
    MinuteTokens,
    Pinned,
    TenantRate,
)
from store.errors import StoreUnavailable
from store.gc import GarbageCollector, clear, collect
from store.interface import KVSpec
from store.parts import CacheOptions, StoreParts
from store.readers import ReaderPool
from store.serde import read_bound
from store.snapshot.export import Manifest, namespace_blocks, write_snapshot
from store.snapshot.importer import ImportReport, import_snapshot
from store.stats import CacheStats, GcReport
from store.writer import BlockWriter

T = TypeVar("T")


class StoreAdmin:
    """Health, statistics, explanations, garbage collection, clearing and snapshots of one cache
    (implements ``CacheAdmin``; see there for each method's contract).

    Args:
        parts: the cache's shared parts.
        options: ``gc_grace_s`` (seconds a blob without an index entry is kept before
            collection) and ``ttl_s`` (the TTL of imported blocks).
        writer: the serving cache's writer: counters are then added in the background, a
            collection ends within the byte budget, and snapshots can be imported. None (the
            command line): counters are added at once.
        spec: the K/V layout blocks must have to be exported or imported (None: no snapshots).
        readers: the threads blob reads for explanations and hot prefixes run on (the lookup's;
            None: two of its own); each caller waits at most ``options.read_timeout_s``.
    """

    def __init__(
        self,
        parts: StoreParts,
        options: CacheOptions,
        writer: BlockWriter | None = None,
        spec: KVSpec | None = None,
        readers: ReaderPool | None = None,
    ) -> None:
        self.parts, self.options, self.writer, self.spec = parts, options, writer, spec
        self._readers = readers or ReaderPool(2)
        # NOTE: the hot prefixes' text is read from block 0's blob once: a hash names its tokens for good
        self.root_tokens = lru_cache(maxsize=256)(self._root_tokens)
        self._collector: GarbageCollector | None = None

    def health(self) -> CacheHealth:
        """Pings Redis when the breaker lets a probe through."""
        return "ok" if self.parts.guard.redis("ping", self._ping) else "degraded"

    def _ping(self) -> bool:
        self.parts.index.ping()
        return True

    def stats(self) -> CacheStats:
        return self.parts.recorder.snapshot(ram_tier_bytes=self.parts.ram.used_bytes)

    def usage(self) -> tuple[int, int] | None:
        index = self.parts.index
        return self.parts.guard.redis("stats", lambda: (index.num_blocks(), index.total_bytes()))

    def deployment_stats(self, namespace: Namespace | None = None) -> DeploymentStats | None:
        p = self.parts
        return p.stats_guard.redis("stats", report.deployment_stats, p.counters, p.index, namespace)

    def timeline(self, namespace: Namespace | None = None, minutes: int = 60) -> list[MinuteTokens] | None:
        return self.parts.stats_guard.redis("stats", report.timeline, self.parts.counters, namespace, minutes)

    def hot_prefixes(
        self, namespace: Namespace | None = None, readable: Namespace | None = None, n: int = 10
    ) -> list[HotPrefixRow] | None:
        args = (self.parts.hot, self.root_tokens, namespace, readable, n)
        return self.parts.stats_guard.redis("stats", report.hot_prefixes, *args)

    def tenant_rates(self, known: Sequence[Namespace] = ()) -> list[TenantRate] | None:
        p, known_hex = self.parts, [ns.hex() for ns in known]
        return p.stats_guard.redis("stats", report.tenant_rates, p.counters, p.hot, known_hex)

    def pin(self, namespace: Namespace, token_ids: Sequence[int], ttl_s: int) -> Pinned | None:
        hashes, pins = block_hashes(token_ids, namespace), self.parts.index.pins
        found = self.parts.guard.redis("pin", pins.pin, namespace, hashes, ttl_s)
        return None if found is None else Pinned(hashes, *found)

    def unpin(self, namespace: Namespace, block_hashes: Sequence[BlockHash]) -> bool:
        def unpin() -> bool:
            self.parts.index.pins.unpin(namespace, block_hashes)
            return True

        return self.parts.guard.redis("pin", unpin) or False

    def pinned_bytes(self) -> int | None:
        return self.parts.guard.redis("stats", self.parts.index.pins.pinned_bytes)

    def divergence(
        self, namespace: Namespace, token_ids: Sequence[int], block: int
    ) -> tuple[int, list[int]] | None:
        read = partial(self._read, monotonic() + self.options.read_timeout_s)
        args = (self.parts.index, read, namespace, token_ids, block)
        return self.parts.guard.redis("children", report.divergence, *args)

    def _root_tokens(self, namespace: Namespace, root: BlockHash) -> tuple[int, ...]:
        read = partial(self._read, monotonic() + self.options.read_timeout_s)
        return report.root_tokens(read, namespace, root)

    def _read(self, deadline: float, namespace: Namespace, block_hash: BlockHash) -> bytes:
        """A blob's bytes (bounded by ``read_bound``), read on a reader thread and waited for
        until ``deadline`` (``time.monotonic``), as a lookup's: a stuck read holds that thread,
        never the caller.

        Raises:
            TimeoutError: not read by the deadline; OSError: as ``BlobBackend.read``.
        """
        bound = None if self.spec is None else read_bound(self.spec)
        future = self._readers.submit(partial(self.parts.blobs.read, namespace, block_hash, bound))
        try:
            data: bytes = future.result(timeout=max(0.0, deadline - monotonic()))
        except FutureTimeout as exc:
            future.cancel()
            raise TimeoutError(f"a blob read took over {self.options.read_timeout_s:.1f} s") from exc
        return data

    def indexed_tokens(self, namespace: Namespace, token_ids: Sequence[int]) -> tuple[int, int] | None:
        hashes = block_hashes(token_ids, namespace)
        rest = token_ids[len(hashes) * BLOCK_SIZE :]
        tail = [tail_hash(hashes[-1] if hashes else namespace, rest)] if rest else []
        index, scope = self.parts.index, namespace.hex()
        missing = self.parts.guard.redis("exists", index.missing, namespace, hashes + tail, scope=scope)
        if missing is None:
            return None
        blocks = next((i for i, gone in enumerate(missing[: len(hashes)]) if gone), len(hashes))
        return blocks, len(rest) if blocks == len(hashes) and tail and not missing[-1] else 0

    def gc(self, grace_s: float | None = None) -> GcReport | None:
        """One collection (``store.gc``), then eviction down to the byte budget; None when Redis
        is unreachable."""
        p = self.parts
        grace = self.options.gc_grace_s if grace_s is None else grace_s
        found = p.guard.redis("gc", collect, p.index, p.blobs, grace)
        if found is not None:
            counts = {
                "evicted_ttl": found.expired,
                "evicted_orphan": found.orphans,
                "evicted_gc": found.missing_blobs + found.unindexed_blobs,
            }
            p.recorder.add(**counts)
            self.share(None, **counts)
            if self.writer is not None:
                self.writer.evict_to_budget()
        return found

    def clear(self, namespace_hex: str | None = None) -> int:
        self.parts.ram.clear(namespace_hex)
        return self._required("clear", clear, self.parts.index, self.parts.blobs, namespace_hex)

    def export_snapshot(
        self,
        out: IO[bytes],
        identity: NamespaceIdentity,
        prompts: Sequence[Sequence[int]] | None = None,
        model: str = "",
    ) -> Manifest:
        spec, namespace = self._snapshots(), identity.digest()
        if prompts is None:
            hashes = self._required("export", namespace_blocks, self.parts.index, namespace)
        else:
            hashes = [h for ids in prompts for h in block_hashes(ids, namespace)]
        args = (out, self.parts, spec, identity, hashes, model)
        return self._required("export", write_snapshot, *args)

    def import_snapshot(
        self, source: IO[bytes], identities: Mapping[str, NamespaceIdentity], audit: bool = False
    ) -> ImportReport:
        spec, writer = self._snapshots(), self.writer
        assert writer is not None
        return import_snapshot(source, writer, spec, identities, self.options.ttl_s, audit)

    def _snapshots(self) -> KVSpec:
        if self.spec is None or self.writer is None:
            raise RuntimeError("snapshots need a serving cache (a model's K/V layout and a writer)")
        return self.spec

    def _required(self, operation: str, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` through the guard; a Redis fault (or an open breaker) raises
        ``StoreUnavailable``."""
        found = self.parts.guard.redis(operation, lambda: [fn(*args)])
        if found is None:
            raise StoreUnavailable(f"the index (Redis) is unreachable: nothing to {operation}")
        return found[0]

    def share(self, namespace: Namespace | None = None, **counts: int) -> None:
        """Add to the deployment-wide counters (and the namespace's): in the background with a
        writer, else now."""
        if self.writer is not None:
            self.writer.share(namespace, also=None, **counts)
            return
        scope = namespace.hex() if namespace is not None else None
        self.parts.stats_guard.redis("stats", self.parts.counters.add, scope, counts)

    def start_gc(self, interval_s: float) -> None:
        """Collect garbage every ``interval_s`` seconds on a daemon thread (until ``close``)."""
        if self._collector is None:
            self._collector = GarbageCollector(self.gc, interval_s)

    def close(self) -> None:
        """Stop the garbage collector."""
        if self._collector is not None:
            self._collector.stop()
            self._collector = None
