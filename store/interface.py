"""Contracts and value types of the prefix cache.

Block tensors have shape ``[num_layers, num_kv_heads, BLOCK_SIZE, head_dim]`` (the layout of
docs/design.md, "Storage"): layer-major, so one block is two contiguous tensors however many layers.

Two interfaces face the other packages: ``PrefixCache`` (here) is what the engine is handed
(look up, save, flush, forget), ``CacheAdmin`` (``store.admin_interface``) what the HTTP server
and the command line read and administer. Both are implemented by ``store.cache.BlockCache``;
nothing above store/ touches its parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from hashing import BLOCK_SIZE, BlockHash, Namespace
from store.block_format import BlockFormat
from store.outcomes import MissReason

TtlPlan = int | Sequence[int | None] | None
"""How long blocks stay cached after a save or a hit, in seconds: one TTL for every block, or one
per leading block (block i takes ``plan[i]``; blocks past the plan, and ``None``, take the
cache's default), or None for the default everywhere."""


def block_ttls(plan: TtlPlan, count: int, default: int) -> list[int]:
    """The TTL of each of ``count`` leading blocks under ``plan``."""
    if plan is None or isinstance(plan, int):
        return [plan or default] * count
    return [(plan[i] if i < len(plan) else None) or default for i in range(count)]


@dataclass(frozen=True)
class KVSpec:
    """Shape and dtype of the K/V a model produces, which every stored block must match.

    Attributes:
        num_layers: attention layers (every one full attention).
        num_kv_heads: key/value heads per layer (after grouped-query sharing).
        head_dim: channels per head.
        dtype: torch dtype name of the model's K/V, e.g. ``"float32"`` (what a block decodes to).
        block_format: how blocks are held at rest (``store.block_format``): ``"exact"``, or
            a lossy format that is part of the namespace.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_format: BlockFormat = "exact"

    @property
    def block_shape(self) -> tuple[int, int, int, int]:
        """``(num_layers, num_kv_heads, BLOCK_SIZE, head_dim)``."""
        return (self.num_layers, self.num_kv_heads, BLOCK_SIZE, self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype)
        assert isinstance(dtype, torch.dtype), self.dtype
        return dtype

    @property
    def block_bytes(self) -> int:
        """Bytes of K plus V for one block, in ``dtype`` (as the engine and the RAM tier hold it)."""
        layers, heads, tokens, dim = self.block_shape
        return 2 * layers * heads * tokens * dim * self.torch_dtype.itemsize


@dataclass(frozen=True)
class KVBlock:
    """One verified block of K/V, or one tail (``hashing.tails``).

    Attributes:
        index: position of the block in its chain (block i covers tokens ``[128i, 128i+128)``);
            a tail after i blocks has index i and covers tokens ``[128i, 128i + L)``.
        block_hash: the chained hash naming tokens ``[0, 128(i+1))`` (a tail: its tail hash).
        token_ids: the block's 128 token ids (a tail's L, 1 <= L < 128).
        key, value: ``[num_layers, num_kv_heads, 128, head_dim]`` tensors (post-rotary K), in
            host memory (a tail's: ``[.., L, head_dim]``).
    """

    index: int
    block_hash: BlockHash
    token_ids: tuple[int, ...]
    key: torch.Tensor
    value: torch.Tensor

    @property
    def is_tail(self) -> bool:
        return len(self.token_ids) < BLOCK_SIZE


class PrefixMatch(NamedTuple):
    """The verified leading blocks of a prompt found in the cache, in chain order, then the tail
    that continues them (its first ``tail_tokens`` tokens are the prompt's next ones), and why the
    match stopped before the prompt's last full block (None when every full block matched; then
    set only when the tail that would have continued them failed: dropped, timed out, unread).
    ``continuation``: token ids a listed tail holds past the prompt's end, when the prompt's
    every full block matched and such a tail holds all of its rest (the start of an answer this
    namespace got to the same prompt before); drafts for speculation (``engine.drafting``),
    never served as K/V."""

    blocks: list[KVBlock]
    miss_reason: MissReason | None = None
    tail: KVBlock | None = None
    tail_tokens: int = 0
    continuation: tuple[int, ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_tokens(self) -> int:
        return BLOCK_SIZE * len(self.blocks) + self.tail_tokens


class PrefixCache(Protocol):
    """What the engine needs of a prefix cache.

    Contract:
    - ``lookup`` never raises for a cache fault (Redis down, blob missing, corrupt or hanging):
      the prefix simply ends at the first block (or tail) it cannot serve, and a bad index entry
      is dropped. It reuses at most ``len(token_ids) - 1`` tokens (the last one is computed).
      It returns within a bounded time (the Redis timeout plus the blob read bound).
      Every block it returns has been verified against ``namespace`` and ``token_ids``, or was
      computed by this process for exactly those tokens (blocks still being saved are served).
    - ``save`` never blocks on I/O and never raises for a cache fault; it only schedules writes.
      A block is indexed only after its blob is completely stored.
    - ``flush`` waits (at most ``timeout_s`` seconds) until scheduled saves are done.
    """

    def lookup(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        max_blocks: int | None = None,
        ttl_s: TtlPlan = None,
        count: bool = True,
    ) -> PrefixMatch:
        """Longest verified cached prefix of ``token_ids``, at most ``max_blocks`` blocks (None:
        every full block, then the longest tail that continues them).

        Refreshes the TTL of every matched block to at least its TTL under ``ttl_s`` (sliding
        TTL; never shortened) and marks them recently used. ``count`` False keeps the lookup out
        of the hit-rate counters (a prewarm is not a request).
        """
        ...

    def save(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        first_block: int,
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: TtlPlan = None,
    ) -> None:
        """Schedule blocks ``first_block ..`` of ``token_ids`` for storage, each with its TTL under
        ``ttl_s`` (the plan counts from block 0).

        Args:
            token_ids: the whole sequence so far (prompt, or prompt + completion).
            first_block: index of the first block covered by ``key``/``value``.
            key, value: ``[m, num_layers, num_kv_heads, 128, head_dim]`` for m blocks, contiguous
                and in host memory (block j is ``key[j]``); they must not be modified afterwards.
        """
        ...

    def save_tail(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: TtlPlan = None,
    ) -> None:
        """Schedule the tail of ``token_ids``, its tokens after its last full block (1 to 127 of
        them: ``len(token_ids) % 128``), for storage; its TTL is that of the block it would be
        under ``ttl_s``. ``key``/``value``: ``[num_layers, num_kv_heads, L, head_dim]``, contiguous
        and in host memory, never modified afterwards."""
        ...

    def flush(self, timeout_s: float) -> bool:
        """Wait for scheduled saves; True when they all finished within ``timeout_s`` seconds."""
        ...

    def settle(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        tolerance: float,
    ) -> None:
        """Audit the imported blocks among blocks ``0 ..`` of ``token_ids`` against ``key`` and
        ``value`` (``[m, num_layers, num_kv_heads, 128, head_dim]``, the engine's own cold
        computation of those m blocks): each imported block equal to it within ``tolerance``
        (relative to the largest magnitude computed) is served from then on; one that is not is
        removed, with every imported block after it. Like ``save``, never blocks or raises."""
        ...

    def forget(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Schedule the removal of blocks (index entries, RAM copies, blobs) that must no longer
        be served, e.g. after a failed fidelity audit; like ``save``, never blocks or raises."""
        ...
