"""``BlockCache``: the serving prefix cache, composed of its parts.

Each part is a module of its own: the index (``store.index``), the blob store (``store.blobs``),
the RAM tier (``ram``), the lookup (``lookup``), the writer (``writer``), and the administrative
side (``admin``: statistics, the garbage collector, clearing, snapshots), all sharing one
``StoreParts``. The engine sees ``PrefixCache`` (this class); the server and the command line see
``CacheAdmin`` (``BlockCache.admin``). Every fault of a part becomes a cache miss or a skipped
save, counted and logged, never an exception for the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hashing import BlockHash, Namespace
from store.admin import StoreAdmin
from store.blobs.base import BlobBackend
from store.index.base import BlockIndex
from store.interface import KVSpec, PrefixMatch, TtlPlan, block_ttls
from store.lookup import PrefixLookup
from store.parts import CacheOptions, StoreParts
from store.writer import BlockWriter


class BlockCache:
    """The prefix cache (implements ``PrefixCache``; ``admin`` implements ``CacheAdmin``).

    Args:
        index: the block index (Redis, or this process's memory).
        blobs: the blob store.
        spec: shape and dtype every block must have.
        options: TTL, byte budget, RAM tier, timeouts (``CacheOptions``).
    """

    def __init__(
        self, index: BlockIndex, blobs: BlobBackend, spec: KVSpec, options: CacheOptions | None = None
    ) -> None:
        options = options or CacheOptions()
        self.spec, self.options = spec, options
        self.parts = StoreParts.open(
            index, blobs, ram_bytes=options.ram_bytes, cooldown_s=options.breaker_cooldown_s
        )
        self.writer = BlockWriter(self.parts, spec, options)
        self._lookup = PrefixLookup(self.parts, self.writer, spec, options)
        self.admin = StoreAdmin(self.parts, options, self.writer, spec)

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
        ttls = block_ttls(ttl_s, first_block + key.shape[0], self.options.ttl_s)[first_block:]
        self.writer.save(namespace, token_ids, first_block, key, value, ttls)

    def flush(self, timeout_s: float) -> bool:
        """See ``PrefixCache.flush``."""
        return self.writer.flush(timeout_s)

    def forget(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """See ``PrefixCache.forget``: on the writer's thread, each block as a failed one is;
        counted as evicted by the audit."""

        def job() -> None:
            self._lookup.discard(namespace, hashes)
            self.parts.recorder.add(evicted_audit=len(hashes))
            self.writer.share(namespace, evicted_audit=len(hashes))

        self.writer.enqueue(job)

    def close(self) -> None:
        """Stop the garbage collector (``admin.start_gc``)."""
        self.admin.close()
