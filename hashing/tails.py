"""Tails: fewer than 128 tokens cached after a chain of full blocks (or the namespace root).

A prompt's last partial block, the end of a completion and the next turn's rendered start are
not blocks, yet the next request reproduces them. A tail is named by what it follows and its own
tokens:

- ``tail(tip, ids) = xxh3_128("kvproxy-tail" || tip || ids as little-endian uint32)``, where
  ``tip`` is the hash of the last full block before it (the namespace digest for a tail at the
  start of a prompt) and ``1 <= len(ids) < 128``.

The tag keeps tail names apart from block names. A tail of L tokens serves a prompt that
continues its tip with all L tokens, or with its first L - 1 (a repeated prompt reuses all but
its last token), so each tail is listed with the name of its first L - 1 tokens too
(``short_tail_hash``). Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from hashing.blocks import BLOCK_SIZE, BlockHash, Namespace, encode_token_ids

TAIL_TAG = b"kvproxy-tail"
"""Prefix of every tail's hash input (a block's has none)."""


def tail_hash(tip: BlockHash | Namespace | bytes, token_ids: Sequence[int]) -> BlockHash:
    """The name of the tail ``token_ids`` (1 to 127 ids) following ``tip``.

    Raises:
        ValueError: ``token_ids`` is empty or a whole block long (or longer).
    """
    if not 0 < len(token_ids) < BLOCK_SIZE:
        raise ValueError(f"a tail holds 1 to {BLOCK_SIZE - 1} tokens, not {len(token_ids)}")
    return BlockHash(xxhash.xxh3_128_digest(TAIL_TAG + tip + encode_token_ids(token_ids)))


def short_tail_hash(tip: BlockHash | Namespace | bytes, token_ids: Sequence[int]) -> BlockHash | None:
    """The name of the tail's first ``len(token_ids) - 1`` ids (None for a one-token tail)."""
    return tail_hash(tip, token_ids[:-1]) if len(token_ids) > 1 else None
