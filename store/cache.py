"""``BlockCache``: the facade of the prefix cache.

It composes the parts, each in a module of its own: the Redis index (``index``), the blob store
(``blobs``), the RAM tier (``ram``), the lookup (``lookup``), the background writer (``writer``),
the garbage collector (``gc``) and the read-only queries (``report``), all meeting faults through
one ``Guard``. Callers see two interfaces: the engine ``PrefixCache``, the server and the command
line ``CacheAdmin`` (``store.interface``). Every fault of a part becomes a cache miss or a skipped
save, counted and logged, never an exception for the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import IO, Any

import torch

from hashing import BlockHash, Namespace, block_hashes
from store.admin import StoreAdmin
from store.blob_backend import BlobBackend
from store.interface import KVSpec, PrefixMatch, TtlPlan, block_ttls
from store.lookup import PrefixLookup
from store.parts import BlockIndex
from store.ram import RamTier
from store.snapshot import namespace_blocks, write_snapshot
from store.snapshot_import import ImportReport, import_snapshot
from store.stats import CacheStats, GcReport
from store.writer import BlockWriter


class BlockCache(StoreAdmin):
    """The prefix cache (implements ``PrefixCache`` and ``CacheAdmin``).

    Args:
        index: the Redis index.
        blobs: the blob store.
        spec: shape and dtype every block must have.
        ttl_s: default TTL in seconds of new entries, refreshed on every hit.
        max_bytes: budget of the blob store in bytes (None: none); least recently used blocks are
            evicted beyond it.
        breaker_cooldown_s: how long to skip Redis after it failed.
        max_pending_saves: bound of the background writer's queue (jobs).
        ram_bytes: budget in bytes of the RAM tier of recently used blocks (0: no RAM tier).
        read_timeout_s: most seconds a lookup waits for blob reads before serving a shorter
            prefix (a stuck disk or mount becomes a miss).
        gc_grace_s: seconds a blob without an index entry is kept before collection.
        pin_memory: keep blocks read from blobs in page-locked memory (for a model on an
            accelerator: uploads are then asynchronous).
    """

    def __init__(
        self,
        index: BlockIndex,
        blobs: BlobBackend,
        spec: KVSpec,
        *,
        ttl_s: int,
        max_bytes: int | None = None,
        breaker_cooldown_s: float = 5.0,
        max_pending_saves: int = 64,
        ram_bytes: int = 0,
        read_timeout_s: float = 5.0,
        gc_grace_s: float = 60.0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(index, blobs, breaker_cooldown_s=breaker_cooldown_s, gc_grace_s=gc_grace_s)
        self.spec, self.ttl_s = spec, ttl_s
        self.ram = RamTier(ram_bytes)
        common = (index, blobs, self.ram)
        self.writer = BlockWriter(
            *common,
            (self.counters, self.stats_guard),
            spec,
            self.guard,
            self.recorder,
            max_bytes=max_bytes,
            max_jobs=max_pending_saves,
        )
        self._lookup = PrefixLookup(
            *common,
            self.writer,
            spec,
            self.guard,
            self.recorder,
            ttl_s=ttl_s,
            read_timeout_s=read_timeout_s,
            pin_memory=pin_memory,
            hot=self.hot,
        )

    def lookup(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        max_blocks: int | None = None,
        ttl_s: TtlPlan = None,
        count: bool = True,
    ) -> PrefixMatch:
        """See ``PrefixCache.lookup``: one Redis round trip, then read and verify in chain order."""
        return self._lookup.lookup(namespace, token_ids, max_blocks, ttl_s, count)

    def save(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        first_block: int,
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: TtlPlan = None,
    ) -> None:
        """See ``PrefixCache.save``: queue the blocks for the background writer."""
        ttls = block_ttls(ttl_s, first_block + key.shape[0], self.ttl_s)[first_block:]
        self.writer.save(namespace, token_ids, first_block, key, value, ttls)

    def flush(self, timeout_s: float) -> bool:
        """See ``PrefixCache.flush``."""
        return self.writer.flush(timeout_s)

    def forget(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """See ``PrefixCache.forget``: on the writer's thread, each block as a failed one is;
        counted as evicted by the audit."""

        def job() -> None:
            self._lookup.discard(namespace, hashes)
            self.recorder.add(evicted_audit=len(hashes))
            self.share(namespace, evicted_audit=len(hashes))

        self.writer.enqueue(job)

    def stats(self) -> CacheStats:
        return self.recorder.snapshot(ram_tier_bytes=self.ram.used_bytes)

    def gc(self, grace_s: float | None = None) -> GcReport | None:
        """A collection (``StoreAdmin.gc``), then eviction down to the byte budget."""
        found = super().gc(grace_s)
        if found is not None:
            self.writer.evict_to_budget()
        return found

    def clear(self, namespace_hex: str | None = None) -> int:
        self.ram.clear(namespace_hex)
        return super().clear(namespace_hex)

    def export_snapshot(
        self,
        out: IO[bytes],
        namespace: Namespace,
        identity: dict[str, Any],
        prompts: Sequence[Sequence[int]] | None = None,
    ) -> dict[str, Any]:
        """See ``CacheAdmin.export_snapshot``."""
        if prompts is None:
            hashes = namespace_blocks(self.index, namespace)
        else:
            hashes = [h for ids in prompts for h in block_hashes(ids, namespace)]
        return write_snapshot(out, self.index, self.blobs, self.spec, namespace, identity, hashes)

    def import_snapshot(
        self, source: IO[bytes], identity_for: Callable[[str], dict[str, Any]]
    ) -> ImportReport:
        """See ``CacheAdmin.import_snapshot``; then evicts down to the byte budget."""
        report = import_snapshot(source, self.index, self.blobs, self.spec, identity_for, self.ttl_s)
        self.writer.evict_to_budget()
        return report

    def share(self, namespace: Namespace | None = None, **counts: int) -> None:
        """Add to the deployment-wide counters in the background (on the writer's thread)."""
        self.writer.share(namespace, also=None, **counts)
