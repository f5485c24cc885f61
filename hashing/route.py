"""Route identity: the namespace under which ``kvproxy route`` names the blocks of the prompts
it forwards, with the same chained ``xxh3_128`` rule as the K/V blocks (``hashing.blocks``).

A route namespace is the digest of ``{"kind": "route", model, tokenizer, block_size, tenant}``;
a K/V namespace's document has no ``kind``, so the two never collide. ``tokenizer`` is the
router's tokenizer fingerprint when it renders prompts to token ids, ``"ids"`` for prompts sent
as token ids without a tokenizer, and ``"text"`` when it cuts the prompt's canonical JSON into
``TEXT_BLOCK_BYTES``-byte blocks instead (each byte one unit).
"""

from __future__ import annotations

import json

import xxhash

from hashing.blocks import BLOCK_SIZE, Namespace

TEXT_BLOCK_BYTES = 512
"""Bytes per block when the router hashes text: about ``BLOCK_SIZE`` tokens of English."""

BYTES_PER_TOKEN = TEXT_BLOCK_BYTES // BLOCK_SIZE
"""How many bytes of text the router counts as one token when it has no tokenizer."""


def route_namespace(*, model: str, tokenizer: str, tenant: str, block_size: int) -> Namespace:
    """Digest of everything two prompts must share for the router to count their blocks alike.

    Args:
        model: the model id the request names (replicas may serve several).
        tokenizer: the tokenizer fingerprint, ``"ids"`` or ``"text"`` (see the module docstring).
        tenant: the tenant of the request's API key.
        block_size: units (tokens or bytes) per block.

    Returns:
        16 bytes: ``xxh3_128`` of the canonical JSON (sorted keys, no spaces, UTF-8).
    """
    doc = {
        "block_size": block_size,
        "kind": "route",
        "model": model,
        "tenant": tenant,
        "tokenizer": tokenizer,
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Namespace(xxhash.xxh3_128_digest(canonical.encode("utf-8")))
