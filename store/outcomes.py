"""Typed outcomes of the cache, defined once here and used unchanged up to the HTTP headers, the
explanation of a miss and the metric labels.

- ``MissReason``: why the cached prefix of a prompt ends where it ends.
- ``CacheKind``: ``hit`` / ``partial`` / ``miss`` for one request.
- ``EvictionReason``: why blocks left the cache.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from hashing import BLOCK_SIZE, num_full_blocks


class MissReason(StrEnum):
    """Why the cached prefix of a prompt stops before its last full block (or why a prompt could
    not hit at all). The value is what clients and dashboards see."""

    NEVER_SEEN = "never seen"
    """The first missing block was never stored (in this namespace)."""
    EXPIRED = "expired or evicted"
    """It was stored once; its TTL ran out or the byte budget evicted it."""
    FAILED_VERIFICATION = "failed verification"
    """Its blob (or the tail's that would have served the tokens after the full blocks) was
    missing, no blob, or not the block the prompt needs (damaged, malformed); it was dropped."""
    UNAVAILABLE = "cache unavailable"
    """Redis did not answer (or its circuit breaker is open): served uncached."""
    UNAUDITED = "imported, not yet audited"
    """The block came from a snapshot and waits for its audit (``--audit-imports``)."""
    TIMED_OUT = "read timed out"
    """Reading the blob did not finish within the lookup's time bound (a stuck disk or mount)."""
    READ_FAILED = "read failed"
    """Reading the blob failed (an I/O error, a bucket that did not answer): served uncached, the
    blob kept for the next request (a missing one is ``FAILED_VERIFICATION``)."""
    DISABLED = "cache disabled"
    """The server runs with ``--no-cache``."""
    BELOW_ONE_BLOCK = "below one block"
    """The prompt is shorter than one block, and no stored tail (``hashing.tails``) holds all
    of it but its last token."""
    PARTIAL_LAST_BLOCK = "partial last block"
    """Every full block hit; no stored tail holds the tokens after the last one (all but the
    prompt's last token)."""


TAIL_FAULTS = (MissReason.FAILED_VERIFICATION, MissReason.TIMED_OUT, MissReason.READ_FAILED)
"""Reasons a tail gives when it was listed but could not be served (``store.tails``)."""

CacheKind = Literal["hit", "partial", "miss"]
"""``hit``: every full block of the prompt came from the cache (or, under one block, a tail served
all of it but its last token); ``partial``: some tokens did; ``miss``: none did."""

EvictionReason = Literal["ttl", "budget", "verification_failure", "gc", "audit"]
"""``ttl``: expired and reclaimed; ``budget``: least recently used beyond the byte budget;
``verification_failure``: a blob that did not verify; ``gc``: orphans, entries without a blob and
blobs without an entry; ``audit``: blocks of a hit the fidelity audit found wrong."""


def cache_kind(prompt_tokens: int, cached_blocks: int, cached_tokens: int | None = None) -> CacheKind:
    """The kind of a request whose ``cached_blocks`` leading full blocks, and ``cached_tokens``
    tokens in all (blocks and tail; None: the blocks' alone), came from the cache."""
    cached = cached_blocks * BLOCK_SIZE if cached_tokens is None else cached_tokens
    if cached <= 0:
        return "miss"
    every_block = 0 < cached_blocks >= num_full_blocks(prompt_tokens)
    return "hit" if every_block or cached >= prompt_tokens - 1 else "partial"


def first_miss(
    prompt_tokens: int, cached_blocks: int, reason: MissReason | None, cached_tokens: int | None = None
) -> tuple[int | None, MissReason | None]:
    """The first block not served from the cache, and why.

    Args:
        prompt_tokens: length of the prompt.
        cached_blocks: leading full blocks served from the cache.
        reason: why the lookup stopped (``PrefixMatch.miss_reason``), None if it did not.
        cached_tokens: tokens served in all, blocks and tail (None: the blocks' alone).

    Returns:
        ``(block index, reason)``, or ``(None, None)`` when every prompt token but the last came
        from the cache.
    """
    if cached_tokens is not None and cached_tokens >= prompt_tokens - 1:
        return None, None
    full = num_full_blocks(prompt_tokens)
    # NOTE: past the full blocks, only a tail's own fault (the tail that would have served the
    # rest was dropped, timed out or unread) says more than "below one block" or "partial"
    failed_tail = reason if reason in TAIL_FAULTS else None
    if full == 0:
        return 0, failed_tail or MissReason.BELOW_ONE_BLOCK
    if cached_blocks < full:
        return cached_blocks, reason or MissReason.NEVER_SEEN
    if prompt_tokens % BLOCK_SIZE:
        return full, failed_tail or MissReason.PARTIAL_LAST_BLOCK
    return None, None
