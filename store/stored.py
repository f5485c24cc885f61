"""What the writer publishes (``store.writer``): ``Stored`` items, made from a request's K/V
(its blocks and its tail) or from a snapshot's verified blobs, and what a publish did."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes, block_tokens, short_tail_hash, tail_hash
from store.interface import KVBlock


class Stored(NamedTuple):
    """One block to publish: the block, its parent (None for block 0), its TTL in seconds, and
    its blob when already encoded (an import keeps the bytes it verified; None: encode here).
    A tail is one too: its parent is its tip, and ``short_hash`` its ``hashing.short_tail_hash``."""

    block: KVBlock
    parent: BlockHash | None
    ttl_s: int
    data: bytes | None = None
    short_hash: BlockHash | None = None


class Published(NamedTuple):
    """What a publish did: per block True (stored now), False (cached already) or None (not
    stored: a blob write failed at or before it, ``failure``)."""

    stored: list[bool | None]
    failure: OSError | None


def blocks_to_store(
    namespace: Namespace,
    token_ids: Sequence[int],
    first_block: int,
    key: torch.Tensor,
    value: torch.Tensor,
    ttls: Sequence[int],
) -> list[Stored]:
    """Blocks ``first_block ..`` of ``token_ids``, their K/V ``key[j]``, ``value[j]``
    (``[m, num_layers, num_kv_heads, 128, head_dim]``, contiguous) and TTLs ``ttls[j]``."""
    assert key.shape[3] == BLOCK_SIZE and key.is_contiguous(), key.shape
    end = first_block + key.shape[0]
    hashes = block_hashes(token_ids[: end * BLOCK_SIZE], namespace)
    pairs = zip(key.unbind(0), value.unbind(0), ttls, strict=True)
    return [
        Stored(KVBlock(i, hashes[i], block_tokens(token_ids, i), k, v), hashes[i - 1] if i else None, ttl)
        for i, (k, v, ttl) in enumerate(pairs, start=first_block)
    ]


def tail_to_store(
    namespace: Namespace, token_ids: Sequence[int], key: torch.Tensor, value: torch.Tensor, ttl_s: int
) -> Stored:
    """The tail of ``token_ids`` (its 1-127 tokens after its last full block), its K/V ``key``,
    ``value`` (``[num_layers, num_kv_heads, L, head_dim]``, contiguous) and TTL."""
    blocks = len(token_ids) // BLOCK_SIZE
    ids = tuple(token_ids[blocks * BLOCK_SIZE :])
    assert 0 < len(ids) == key.shape[2] and key.is_contiguous(), (len(ids), key.shape)
    tip = block_hashes(token_ids[: blocks * BLOCK_SIZE], namespace)[-1] if blocks else None
    root = tip or namespace
    tail = KVBlock(blocks, tail_hash(root, ids), ids, key, value)
    return Stored(tail, tip, ttl_s, short_hash=short_tail_hash(root, ids))
