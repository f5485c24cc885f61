"""Block identity: tokens -> full 128-token blocks -> chained block hashes.

Pure functions, no I/O. The rules are normative (docs/design.md, "Block identity"):

- namespace ``N = NamespaceIdentity(...).digest()``, ``xxh3_128`` of the canonical JSON of
  {format_version, model_fingerprint, kv_dtype, weights, device, block_size, tenant}
  (``hashing.identity``);
- block 0: ``h0 = xxh3_128(N || ids[0:128] as little-endian uint32)``;
- block i: ``hi = xxh3_128(h(i-1) || ids[128i:128i+128] as little-endian uint32)``.

A partial last block is not a block: it may be cached as a *tail* (``hashing.tails``).
``block_tokens`` is the one place a block's token ids are sliced out of a sequence, and
``reusable_tokens`` the one place the "reuse at most n - 1 tokens" rule is written.
"""

from hashing.blocks import (
    BLOCK_SIZE,
    FORMAT_VERSION,
    BlockHash,
    Namespace,
    block_hashes,
    block_tokens,
    chain_hash,
    encode_token_ids,
    num_full_blocks,
    reusable_tokens,
)
from hashing.identity import NamespaceIdentity
from hashing.route import BYTES_PER_TOKEN, TEXT_BLOCK_BYTES, route_namespace
from hashing.tails import shared_tokens, short_tail_hash, tail_hash

__all__ = [
    "BLOCK_SIZE",
    "BYTES_PER_TOKEN",
    "FORMAT_VERSION",
    "TEXT_BLOCK_BYTES",
    "BlockHash",
    "Namespace",
    "NamespaceIdentity",
    "block_hashes",
    "block_tokens",
    "chain_hash",
    "encode_token_ids",
    "num_full_blocks",
    "reusable_tokens",
    "route_namespace",
    "shared_tokens",
    "short_tail_hash",
    "tail_hash",
]
