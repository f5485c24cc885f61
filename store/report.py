"""Read-only questions about the cache, for stats pages and explanations.

Each answers None when Redis is unreachable (through ``BlockCache.guarded``), never raises for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hashing import BLOCK_SIZE, Namespace, block_hashes
from store.cache import BlockCache
from store.serde import BlockVerificationError, read_token_ids


def stored(cache: BlockCache) -> tuple[int, int] | None:
    """``(blocks, bytes)`` the whole cache holds now."""
    return cache.guarded("stats", lambda: (cache.index.num_blocks(), cache.index.total_bytes()))


def shared_stats(cache: BlockCache, namespace: Namespace | None = None) -> dict[str, Any] | None:
    """Counters of the deployment (or of one namespace) from Redis, the token hit rate over the
    last minute and hour, and, for the deployment, the blocks and bytes stored now."""
    scope = namespace.hex() if namespace is not None else None

    def read() -> dict[str, Any]:
        out: dict[str, Any] = dict(cache.shared.totals(scope))
        for label, seconds in (("last_minute", 60), ("last_hour", 3600)):
            window = cache.shared.window(scope, seconds)
            out[label] = {
                "queried_tokens": window.queried,
                "hit_tokens": window.hit,
                "hit_rate": window.hit_rate,
            }
        if namespace is None:
            out |= {"blocks": cache.index.num_blocks(), "bytes": cache.index.total_bytes()}
        return out

    return cache.guarded("stats", read)


def timeline(
    cache: BlockCache, namespace: Namespace | None = None, minutes: int = 60
) -> list[dict[str, Any]] | None:
    """Tokens queried and hit per minute over the last ``minutes``."""
    scope = namespace.hex() if namespace is not None else None
    buckets = cache.guarded("stats", cache.shared.buckets, scope, minutes * 60)
    if buckets is None:
        return None
    per_minute: dict[int, list[int]] = {}
    for start, window in buckets:
        totals = per_minute.setdefault(start - start % 60, [0, 0])
        totals[0] += window.queried
        totals[1] += window.hit
    return [
        {"minute": m, "queried_tokens": q, "hit_tokens": h, "hit_rate": h / q if q else None}
        for m, (q, h) in sorted(per_minute.items())
    ]


def divergence(
    cache: BlockCache, namespace: Namespace, token_ids: Sequence[int], block: int
) -> tuple[int, list[int]] | None:
    """Where ``token_ids`` first differs from a cached sibling of its block ``block``.

    Looks for a stored block with the same parent (so the same tokens before it, in this
    namespace only) and compares token ids.

    Returns:
        ``(token position, the sibling's 128 token ids)``, or None when no sibling is stored.
    """
    prefix = block_hashes(token_ids[: block * BLOCK_SIZE], namespace)
    siblings = cache.guarded("children", cache.index.children, namespace, prefix[-1] if prefix else None)
    mine = list(token_ids[block * BLOCK_SIZE : (block + 1) * BLOCK_SIZE])
    for sibling in siblings or []:
        try:
            theirs = read_token_ids(cache.blobs.read(cache.blobs.relative_path(namespace, sibling)))
        except (OSError, BlockVerificationError):
            continue
        differs = next((j for j, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
        if differs is not None:
            return block * BLOCK_SIZE + differs, theirs
    return None
