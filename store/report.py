"""Read-only questions about the cache, for stats pages and explanations of misses.

Each function may raise ``redis.RedisError``; the facade (``BlockCache``) calls them through its
guard, so callers above store/ get None instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hashing import BLOCK_SIZE, Namespace, block_hashes, block_tokens
from store.blob_backend import BlobBackend
from store.parts import BlockIndex, Counters
from store.serde import BlockVerificationError, read_token_ids


def deployment_stats(counters: Counters, index: BlockIndex, namespace: Namespace | None) -> dict[str, Any]:
    """Counters of the deployment (or of one namespace), the token hit rate over the last minute
    and hour, and, for the deployment, the blocks and bytes stored now."""
    scope = namespace.hex() if namespace is not None else None
    out: dict[str, Any] = dict(counters.totals(scope))
    for label, seconds in (("last_minute", 60), ("last_hour", 3600)):
        window = counters.window(scope, seconds)
        out[label] = {"queried_tokens": window.queried, "hit_tokens": window.hit, "hit_rate": window.hit_rate}
    if namespace is None:
        out |= {"blocks": index.num_blocks(), "bytes": index.total_bytes()}
    return out


def timeline(counters: Counters, namespace: Namespace | None, minutes: int) -> list[dict[str, Any]]:
    """Tokens queried and hit per minute over the last ``minutes``."""
    scope = namespace.hex() if namespace is not None else None
    per_minute: dict[int, list[int]] = {}
    for start, window in counters.buckets(scope, minutes * 60):
        totals = per_minute.setdefault(start - start % 60, [0, 0])
        totals[0] += window.queried
        totals[1] += window.hit
    return [
        {"minute": m, "queried_tokens": q, "hit_tokens": h, "hit_rate": h / q if q else None}
        for m, (q, h) in sorted(per_minute.items())
    ]


def divergence(
    index: BlockIndex, blobs: BlobBackend, namespace: Namespace, token_ids: Sequence[int], block: int
) -> tuple[int, list[int]] | None:
    """Where ``token_ids`` first differs from a cached sibling of its block ``block``.

    Looks for a stored block with the same parent (so the same tokens before it, in this
    namespace only) and compares token ids.

    Returns:
        ``(token position, the sibling's 128 token ids)``, or None when no sibling is stored.
    """
    prefix = block_hashes(token_ids[: block * BLOCK_SIZE], namespace)
    mine = block_tokens(token_ids, block)
    for sibling in index.children(namespace, prefix[-1] if prefix else None):
        try:
            theirs = read_token_ids(blobs.read(namespace, sibling))
        except (OSError, BlockVerificationError):
            continue
        differs = next((j for j, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
        if differs is not None:
            return block * BLOCK_SIZE + differs, theirs
    return None
