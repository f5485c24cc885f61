"""Read-only questions about the cache, for stats pages and explanations of misses.

Each function may raise ``redis.RedisError``; the facade (``BlockCache``) calls them through its
guard, so callers above store/ get None instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes, block_tokens, chain_hash
from store.admin_interface import (
    DeploymentStats,
    HotPrefixRow,
    MinuteTokens,
    StoredNow,
    TenantRate,
    TokenWindow,
)
from store.index.base import BlockIndex, Counters, HotPrefix, HotPrefixes
from store.index.retention import RETENTION_CLASSES
from store.serde import BlockVerificationError, read_token_ids


def deployment_stats(counters: Counters, index: BlockIndex, namespace: Namespace | None) -> DeploymentStats:
    """Counters of the deployment (or of one namespace), the token hit rate over the last minute
    and hour, and, for the deployment, the blocks and bytes stored now."""
    scope = namespace.hex() if namespace is not None else None
    totals = dict(counters.totals(scope))
    minute, hour = (TokenWindow.of(counters.window(scope, seconds)) for seconds in (60, 3600))
    stored = None
    if namespace is None:
        classes = zip(RETENTION_CLASSES, index.retention_counts(), strict=True)
        stored = StoredNow(
            index.num_blocks(),
            index.total_bytes(),
            index.pins.pinned_bytes(),
            {name: n for (name, _), n in classes},
        )
    return DeploymentStats(totals, minute, hour, stored)


def timeline(counters: Counters, namespace: Namespace | None, minutes: int) -> list[MinuteTokens]:
    """Tokens queried and hit per minute over the last ``minutes``."""
    scope = namespace.hex() if namespace is not None else None
    per_minute: dict[int, list[int]] = {}
    for start, window in counters.buckets(scope, minutes * 60):
        totals = per_minute.setdefault(start - start % 60, [0, 0])
        totals[0] += window.queried
        totals[1] += window.hit
    return [MinuteTokens(m, q, h, h / q if q else None) for m, (q, h) in sorted(per_minute.items())]


BlobRead = Callable[[Namespace, BlockHash], bytes]
"""Reads a block's blob (``StoreAdmin``'s bounded read); raises ``OSError``."""
SIBLINGS_READ = 16
"""The most sibling blocks one explanation reads."""


def divergence(
    index: BlockIndex, read: BlobRead, namespace: Namespace, token_ids: Sequence[int], block: int
) -> tuple[int, list[int]] | None:
    """Where ``token_ids`` first differs from a cached sibling of its block ``block``.

    Looks for a stored block with the same parent (so the same tokens before it, in this
    namespace only) and compares token ids; of the first ``SIBLINGS_READ`` siblings, the one that
    agrees longest. A sibling ``read`` cannot give (``OSError``, a timeout among them: the reads
    are the caller's to bound) is passed over.

    Returns:
        ``(token position, the sibling's 128 token ids)``, or None when no sibling is stored.
    """
    prefix = block_hashes(token_ids[: block * BLOCK_SIZE], namespace)
    mine = block_tokens(token_ids, block)
    best: tuple[int, list[int]] | None = None
    for sibling in list(index.children(namespace, prefix[-1] if prefix else None))[:SIBLINGS_READ]:
        try:
            theirs = read_token_ids(read(namespace, sibling))
        except (OSError, BlockVerificationError):
            continue
        differs = next((j for j, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
        if differs is not None and (best is None or block * BLOCK_SIZE + differs > best[0]):
            best = block * BLOCK_SIZE + differs, theirs
    return best


def hot_prefixes(
    hot: HotPrefixes,
    read_root: Callable[[Namespace, BlockHash], tuple[int, ...]],
    namespace: Namespace | None,
    readable: Namespace | None,
    n: int,
) -> list[HotPrefixRow]:
    """The ``n`` cached prefixes that saved the most tokens, of one namespace or all: their
    hits, tokens saved, length (blocks, tokens), bytes (blocks x the last block's blob bytes),
    seconds left to live and, for namespace ``readable`` only, the token ids of block 0 (from
    ``read_root``, e.g. ``root_tokens``; None when they cannot be read)."""
    return [
        HotPrefixRow(
            namespace=p.namespace.hex(),
            hits=p.hits,
            tokens_saved=p.tokens_saved,
            blocks=p.blocks,
            cached_tokens=p.blocks * BLOCK_SIZE,
            bytes=p.blocks * p.block_bytes,
            ttl_seconds=p.ttl_s,
            token_ids=_readable(read_root, p) if p.namespace == readable else None,
        )
        for p in hot.top(namespace, n)
    ]


def root_tokens(read: BlobRead, namespace: Namespace, root: BlockHash) -> tuple[int, ...]:
    """The token ids of block 0 named ``root``, read from its blob (by ``read``).

    NOTE: the ids are the block's only if they hash to its name, so a wrong blob shows no text;
    and a name stands for the same ids for good, so a caller may keep them.

    Raises:
        OSError: the blob cannot be read; BlockVerificationError: it is not that block's.
    """
    ids = read_token_ids(read(namespace, root))
    if len(ids) != BLOCK_SIZE or chain_hash(namespace, ids) != root:
        raise BlockVerificationError("block 0's token ids do not hash to its name")
    return tuple(ids)


def _readable(
    read_root: Callable[[Namespace, BlockHash], tuple[int, ...]], prefix: HotPrefix
) -> list[int] | None:
    try:
        return list(read_root(prefix.namespace, prefix.root))
    except (OSError, BlockVerificationError):
        return None


def tenant_rates(counters: Counters, hot: HotPrefixes | None, known: Sequence[str]) -> list[TenantRate]:
    """Prompt and cached tokens, all time and over the last hour, of each namespace that stored
    a block or is in ``known`` (hex) and has any traffic; most prompt tokens first."""
    rows = []
    for ns in sorted({*known, *(hot.namespaces() if hot is not None else ())}):
        totals, hour = counters.totals(ns), counters.window(ns, 3600)
        prompt, cached = totals.get("prompt_tokens", 0), totals.get("cached_tokens", 0)
        if prompt or hour.queried:
            hit_rate = cached / prompt if prompt else None
            rows.append(TenantRate(ns, prompt, cached, hit_rate, TokenWindow.of(hour)))
    return sorted(rows, key=lambda r: -r.prompt_tokens)
