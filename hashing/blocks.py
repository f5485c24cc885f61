"""Chained xxh3-128 block hashes over 128-token blocks (see the package docstring)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NewType

import xxhash

BLOCK_SIZE = 128
"""Tokens per block. Part of every namespace, so changing it never reuses old blocks."""

FORMAT_VERSION = 1
"""Version of the block format (hash rule + blob layout). Bump it to invalidate every block."""

BlockHash = NewType("BlockHash", bytes)
"""16-byte xxh3-128 digest naming one block and, through the chain, all blocks before it."""

Namespace = NewType("Namespace", bytes)
"""16-byte xxh3-128 digest of what makes K/V reusable (``hashing.identity.NamespaceIdentity``)."""


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (4 bytes each), independent of the platform.

    Raises:
        struct.error: a token id is negative or does not fit in 32 bits.
    """
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def num_full_blocks(num_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """How many full blocks ``num_tokens`` tokens make; a partial last block does not count."""
    return num_tokens // block_size


def block_tokens(token_ids: Sequence[int], i: int, block_size: int = BLOCK_SIZE) -> tuple[int, ...]:
    """The token ids of block ``i``: positions ``[i * block_size, (i + 1) * block_size)``.

    NOTE: the one place a block is sliced out of a sequence, so hashing, saving, verifying and
    explaining always agree on which tokens a block holds. Fewer than ``block_size`` ids come
    back only for a partial last block, which is never hashed, stored or served.
    """
    return tuple(token_ids[i * block_size : (i + 1) * block_size])


def reusable_tokens(num_tokens: int, cached_blocks: int, block_size: int = BLOCK_SIZE) -> int:
    """How many leading tokens of an ``num_tokens``-token prompt are taken from ``cached_blocks``
    cached leading blocks: ``min(block_size * cached_blocks, num_tokens - 1)`` (0 for an empty
    prompt).

    NOTE: capped at n - 1 so the last prompt token is always computed: its logits are what the
    first generated token is sampled from. A fully cached prompt whose length is a multiple of
    the block size reuses all but the last token of its last block and computes exactly one
    token; no token is ever fed twice. This is also what ``cached_tokens`` reports.
    """
    return max(0, min(block_size * cached_blocks, num_tokens - 1))


def block_hashes(
    token_ids: Sequence[int], namespace: Namespace, block_size: int = BLOCK_SIZE
) -> list[BlockHash]:
    """Chained hashes of the full blocks of ``token_ids``.

    Args:
        token_ids: the prompt (or prompt + completion) as token ids, length n.
        namespace: ``NamespaceIdentity.digest()``; the root of the chain.
        block_size: tokens per block.

    Returns:
        ``n // block_size`` hashes; hash i names tokens ``[0, (i+1)*block_size)``.
    """
    hashes: list[BlockHash] = []
    parent: bytes = namespace
    for i in range(num_full_blocks(len(token_ids), block_size)):
        parent = chain_hash(parent, block_tokens(token_ids, i, block_size))
        hashes.append(parent)
    return hashes


def chain_hash(parent: BlockHash | Namespace | bytes, block: Sequence[int]) -> BlockHash:
    """The hash of a block whose tokens are ``block``, after the block ``parent`` (the namespace
    for block 0): ``xxh3_128(parent || block as little-endian uint32)``."""
    return BlockHash(xxhash.xxh3_128_digest(parent + encode_token_ids(block)))
