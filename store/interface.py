"""Contracts and value types of the prefix cache.

Block tensors have shape ``[num_layers, num_kv_heads, BLOCK_SIZE, head_dim]`` (the layout of
docs/design.md, "Storage"): layer-major, so one block is two contiguous tensors however many layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import torch

from hashing import BLOCK_SIZE, BlockHash, Namespace

CacheHealth = Literal["ok", "degraded", "disabled"]


@dataclass(frozen=True)
class KVSpec:
    """Shape and dtype of the K/V a model produces, which every stored block must match.

    Attributes:
        num_layers: attention layers (every one full attention).
        num_kv_heads: key/value heads per layer (after grouped-query sharing).
        head_dim: channels per head.
        dtype: torch dtype name of the stored tensors, e.g. ``"float32"``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str

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
        """Bytes of K plus V for one block."""
        layers, heads, tokens, dim = self.block_shape
        return 2 * layers * heads * tokens * dim * self.torch_dtype.itemsize


@dataclass(frozen=True)
class KVBlock:
    """One verified block of K/V.

    Attributes:
        index: position of the block in its chain (block i covers tokens ``[128i, 128i+128)``).
        block_hash: the chained hash naming tokens ``[0, 128(i+1))``.
        token_ids: the block's 128 token ids.
        key, value: ``[num_layers, num_kv_heads, 128, head_dim]`` tensors (post-rotary K).
    """

    index: int
    block_hash: BlockHash
    token_ids: tuple[int, ...]
    key: torch.Tensor
    value: torch.Tensor


class PrefixMatch(NamedTuple):
    """The verified leading blocks of a prompt found in the cache, in chain order, and why the
    match stopped before the prompt's last full block: ``"never seen"``, ``"expired or
    evicted"``, ``"failed verification"``, ``"cache unavailable"``, or None when every full
    block matched."""

    blocks: list[KVBlock]
    miss_reason: str | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_tokens(self) -> int:
        return BLOCK_SIZE * len(self.blocks)


class PrefixCache(Protocol):
    """What the engine needs of a prefix cache. ``store.cache.BlockCache`` implements it.

    Contract:
    - ``lookup`` never raises for a cache fault (Redis down, blob missing or corrupt): the
      prefix simply ends at the first block it cannot serve, and a bad index entry is dropped.
      Every block it returns has been verified against ``namespace`` and ``token_ids``, or was
      computed by this process for exactly those tokens (blocks still being saved are served).
    - ``save`` never blocks on I/O and never raises for a cache fault; it only schedules writes.
      A block is indexed only after its blob is completely on disk.
    - ``flush`` waits (at most ``timeout_s`` seconds) until scheduled saves are done.
    """

    def lookup(
        self, namespace: Namespace, token_ids: Sequence[int], max_blocks: int, ttl_s: int | None = None
    ) -> PrefixMatch:
        """Longest verified cached prefix of ``token_ids``, at most ``max_blocks`` blocks.

        Refreshes the TTL of every matched block to at least ``ttl_s`` seconds (sliding TTL;
        None: the cache's default) and marks them recently used.
        """
        ...

    def save(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        first_block: int,
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: int | None = None,
    ) -> None:
        """Schedule blocks ``first_block ..`` of ``token_ids`` for storage with a TTL of ``ttl_s``
        seconds (None: the cache's default).

        Args:
            token_ids: the whole sequence so far (prompt, or prompt + completion).
            first_block: index of the first block covered by ``key``/``value``.
            key, value: ``[num_layers, num_kv_heads, 128 * m, head_dim]`` for m blocks; the
                tensors must not be modified afterwards (pass a copy).
        """
        ...

    def flush(self, timeout_s: float) -> bool:
        """Wait for scheduled saves; True when they all finished within ``timeout_s`` seconds."""
        ...

    def health(self) -> CacheHealth:
        """``"ok"`` when the index answers, ``"degraded"`` while it does not."""
        ...
