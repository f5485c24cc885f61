"""Tails: fewer than 128 tokens cached after a chain of full blocks (or the namespace root).

A prompt's last partial block, the end of a completion and the next turn's rendered start are
not blocks, yet the next request reproduces them. A tail is named by what it follows and its own
tokens:

- ``tail(tip, ids) = xxh3_128("kvproxy-tail" || tip || ids as little-endian uint32)``, where
  ``tip`` is the hash of the last full block before it (the namespace digest for a tail at the
  start of a prompt) and ``1 <= len(ids) < 128``.

The tag keeps tail names apart from block names. A tail serves a prompt that continues its tip
with the tail's first k tokens, for the longest such k (``shared_tokens``): all L of them, its
first L - 1 (a repeated prompt reuses all but its last token), or fewer (a history that renders
a generated answer with other tokens than the model sampled, from the first one that differs).
Each tail is listed with the name of its first L - 1 tokens (``short_tail_hash``) and its token
ids, so a lookup can tell how far it goes on without reading it. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import takewhile

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


def shared_tokens(tail_ids: Sequence[int], rest: Sequence[int], room: int) -> int:
    """How many tokens a tail holding ``tail_ids`` serves a prompt whose tokens after the tail's
    tip are ``rest``: the length of their longest common prefix, at most ``room`` (the tokens
    the prompt may reuse there: ``reusable_tokens``' rule, at most 127).

    NOTE: attention is causal, so the K/V of a tail's first k tokens depend only on the tokens
    before them (its tip's chain and those k): they are the K/V a cold prefill computes for any
    prompt that shares them, whatever the tail holds after them.
    """
    pairs = zip(tail_ids[:room], rest[:room], strict=False)
    return sum(1 for _ in takewhile(lambda pair: pair[0] == pair[1], pairs))
