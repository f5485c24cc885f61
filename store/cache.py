"""``BlockCache``: the serving prefix cache, composed of its parts.

Each part is a module of its own: the index (``store.index``), the blob store (``store.blobs``),
the RAM tier (``ram``), the lookup (``lookup``), the writer (``writer``), and the administrative
side (``admin``: statistics, the garbage collector, clearing, snapshots), all sharing one
``StoreParts``. The engine sees ``PrefixCache`` (this class); the server and the command line see
``CacheAdmin`` (``BlockCache.admin``). Every fault of a part becomes a cache miss or a skipped
save, counted and logged, never an exception for the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import torch

from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes, block_tokens
from store.admin import StoreAdmin
from store.blobs.base import BlobBackend
from store.entries import member_name
from store.index.base import BlockIndex
from store.interface import KVSpec, PrefixMatch, TtlPlan, block_ttls
from store.lookup import PrefixLookup
from store.parts import CacheOptions, StoreParts
from store.serde import BlockVerificationError, decode_block, read_bound
from store.writer import BlockWriter

log = logging.getLogger(__name__)


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
            index,
            blobs,
            ram_bytes=options.ram_bytes,
            cooldown_s=options.breaker_cooldown_s,
            redis=options.redis,
        )
        self.writer = BlockWriter(self.parts, spec, options)
        self._lookup = PrefixLookup(self.parts, self.writer, spec, options)
        self.admin = StoreAdmin(self.parts, options, self.writer, spec, self._lookup.readers)

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

    def save_tail(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: TtlPlan = None,
    ) -> None:
        """See ``PrefixCache.save_tail``: queue the tail for the background writer (unless tails
        are off, ``CacheOptions.tails``)."""
        if not self.options.tails:
            return
        position = len(token_ids) // BLOCK_SIZE
        ttl = block_ttls(ttl_s, position + 1, self.options.ttl_s)[position]
        self.writer.save_tail(namespace, token_ids, key, value, ttl)

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

    def settle(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        tolerance: float,
    ) -> None:
        """See ``PrefixCache.settle``: on the writer's thread, each imported block of the chain is
        compared with the engine's own K/V; equal within ``tolerance`` (relative to the largest
        magnitude of the engine's), it is promoted (served from now on), else removed with every
        imported block after it."""

        def job() -> None:
            parts, scope = self.parts, namespace.hex()
            hashes = block_hashes(token_ids[: key.shape[0] * BLOCK_SIZE], namespace)
            members = [member_name(namespace, h) for h in hashes]
            entries = parts.guard.redis("entries", parts.index.entries, members, scope=scope)
            confirmed: list[BlockHash] = []
            wrong: list[BlockHash] = []
            for i, entry in enumerate(entries or []):
                if entry is None or not entry.imported:
                    continue
                if wrong or not self._same(namespace, token_ids, hashes, i, key, value, tolerance):
                    wrong.append(hashes[i])
                else:
                    confirmed.append(hashes[i])
            if confirmed:
                parts.guard.redis("promote", parts.index.promote, namespace, confirmed, scope=scope)
            if wrong:
                log.warning(
                    "imported blocks differ from this model's computation: removing %s",
                    " ".join(h.hex() for h in wrong),
                )
                self._lookup.discard(namespace, wrong)
            parts.recorder.add(imports_confirmed=len(confirmed), imports_rejected=len(wrong))

        self.writer.enqueue(job)

    def _same(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        hashes: list[BlockHash],
        i: int,
        key: torch.Tensor,
        value: torch.Tensor,
        tolerance: float,
    ) -> bool:
        """Whether block ``i``'s blob holds, within ``tolerance``, the K/V ``key[i]``, ``value[i]``."""
        parent = hashes[i - 1] if i else None
        try:
            decode = partial(
                decode_block,
                index=i,
                block_hash=hashes[i],
                parent=parent,
                namespace=namespace,
                token_ids=block_tokens(token_ids, i),
                spec=self.spec,
            )
            stored = self.parts.blobs.read_checked(namespace, hashes[i], decode, read_bound(self.spec))
        except (OSError, BlockVerificationError):
            return False
        pairs = ((stored.key, key[i]), (stored.value, value[i]))
        return all(
            float((a.float() - b.float()).abs().max()) <= tolerance * float(b.abs().max()) for a, b in pairs
        )

    def close(self) -> None:
        """Stop the garbage collector (``admin.start_gc``)."""
        self.admin.close()
