"""The dashboard's TTFT series, from this process's request records: TTFT per minute by cache
outcome, TTFT against the length of the cached prefix (the curve of what caching buys), and TTFT
of each outcome against prompt length (so hits and misses are compared at equal lengths).

Pure functions over plain tuples, so the binning and the percentiles are tested on their own.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from store.outcomes import CacheKind

KINDS: tuple[CacheKind, ...] = ("hit", "partial", "miss")

CACHED_TOKEN_BINS: tuple[tuple[int, int | None], ...] = (
    (0, 0),
    (1, 255),
    (256, 511),
    (512, 1023),
    (1024, 2047),
    (2048, 4095),
    (4096, None),
)
"""Bins of cached-prefix length, ``(min, max)`` tokens inclusive (None: no upper bound): nothing
cached, then one or two blocks, then doubling."""


def _p50(values: list[float]) -> dict[str, Any]:
    return {"count": len(values), "p50": statistics.median(values) if values else None}


def ttft_per_minute(samples: Iterable[tuple[float, CacheKind, float]]) -> list[dict[str, Any]]:
    """Median TTFT per minute and cache outcome.

    Args:
        samples: ``(Unix time of the first token, cache outcome, TTFT in seconds)``.

    Returns:
        One row per minute that has requests, oldest first: ``{"minute": start of the minute in
        Unix seconds, "hit"|"partial"|"miss": {"count", "p50" (seconds, None: no request)}}``.
    """
    by_minute: dict[int, dict[CacheKind, list[float]]] = defaultdict(lambda: defaultdict(list))
    for at, kind, ttft in samples:
        by_minute[int(at) - int(at) % 60][kind].append(ttft)
    return [
        {"minute": minute} | {kind: _p50(kinds[kind]) for kind in KINDS}
        for minute, kinds in sorted(by_minute.items())
    ]


def ttft_by_cached_tokens(samples: Iterable[tuple[int, float]]) -> list[dict[str, Any]]:
    """Median TTFT per bin of cached-prefix length (``CACHED_TOKEN_BINS``), every bin listed.

    Args:
        samples: ``(cached tokens, TTFT in seconds)``.

    Returns:
        ``{"min_tokens", "max_tokens" (None: unbounded), "count", "p50" (seconds, None: no
        request)}`` per bin, shortest prefixes first.
    """
    binned: list[list[float]] = [[] for _ in CACHED_TOKEN_BINS]
    for cached, ttft in samples:
        for values, (low, high) in zip(binned, CACHED_TOKEN_BINS, strict=True):
            if low <= cached and (high is None or cached <= high):
                values.append(ttft)
                break
    return [
        {"min_tokens": low, "max_tokens": high} | _p50(values)
        for values, (low, high) in zip(binned, CACHED_TOKEN_BINS, strict=True)
    ]


PROMPT_TOKEN_BINS: tuple[tuple[int, int | None], ...] = CACHED_TOKEN_BINS[1:]
"""Bins of prompt length, ``(min, max)`` tokens inclusive: up to two blocks, then doubling."""


def ttft_by_prompt_tokens(samples: Iterable[tuple[int, CacheKind, float]]) -> list[dict[str, Any]]:
    """Median TTFT per bin of prompt length (``PROMPT_TOKEN_BINS``) and cache outcome, every bin
    listed: a hit's TTFT is compared with misses of its own length, not with short ones.

    Args:
        samples: ``(prompt tokens, cache outcome, TTFT in seconds)``.

    Returns:
        ``{"min_tokens", "max_tokens" (None: unbounded), "hit"|"partial"|"miss": {"count",
        "p50" (seconds, None: no request)}}`` per bin, shortest prompts first.
    """
    binned: list[dict[CacheKind, list[float]]] = [defaultdict(list) for _ in PROMPT_TOKEN_BINS]
    for tokens, kind, ttft in samples:
        for values, (low, high) in zip(binned, PROMPT_TOKEN_BINS, strict=True):
            if low <= tokens and (high is None or tokens <= high):
                values[kind].append(ttft)
                break
    return [
        {"min_tokens": low, "max_tokens": high} | {kind: _p50(values[kind]) for kind in KINDS}
        for values, (low, high) in zip(binned, PROMPT_TOKEN_BINS, strict=True)
    ]
