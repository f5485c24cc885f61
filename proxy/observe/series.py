"""The dashboard's TTFT series, from this process's request records: TTFT per minute by cache
outcome, TTFT against the length of the cached prefix (the curve of what caching buys), and TTFT
of each outcome against prompt length (so hits and misses are compared at equal lengths).

Pure functions over plain tuples, so the binning and the percentiles are tested on their own.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Median:
    """How many TTFTs, and their median in seconds (None: no request)."""

    count: int
    p50: float | None


@dataclass(frozen=True)
class MinuteTtft:
    """Median TTFT of one minute (``minute``: its start, Unix seconds) by cache outcome."""

    minute: int
    hit: Median
    partial: Median
    miss: Median


@dataclass(frozen=True)
class CachedTokensTtft:
    """Median TTFT of one bin of cached-prefix length (tokens inclusive; None: unbounded)."""

    min_tokens: int
    max_tokens: int | None
    count: int
    p50: float | None


@dataclass(frozen=True)
class PromptTokensTtft:
    """Median TTFT of one bin of prompt length (tokens inclusive; None: unbounded) by outcome."""

    min_tokens: int
    max_tokens: int | None
    hit: Median
    partial: Median
    miss: Median


def _p50(values: list[float]) -> Median:
    return Median(len(values), statistics.median(values) if values else None)


def ttft_per_minute(samples: Iterable[tuple[float, CacheKind, float]]) -> list[MinuteTtft]:
    """Median TTFT per minute and cache outcome.

    Args:
        samples: ``(Unix time of the first token, cache outcome, TTFT in seconds)``.

    Returns:
        One row per minute that has requests, oldest first.
    """
    by_minute: dict[int, dict[CacheKind, list[float]]] = defaultdict(lambda: defaultdict(list))
    for at, kind, ttft in samples:
        by_minute[int(at) - int(at) % 60][kind].append(ttft)
    return [
        MinuteTtft(minute, *(_p50(kinds[kind]) for kind in KINDS))
        for minute, kinds in sorted(by_minute.items())
    ]


def ttft_by_cached_tokens(samples: Iterable[tuple[int, float]]) -> list[CachedTokensTtft]:
    """Median TTFT per bin of cached-prefix length (``CACHED_TOKEN_BINS``), every bin listed.

    Args:
        samples: ``(cached tokens, TTFT in seconds)``.

    Returns:
        One row per bin, shortest prefixes first.
    """
    binned: list[list[float]] = [[] for _ in CACHED_TOKEN_BINS]
    for cached, ttft in samples:
        for values, (low, high) in zip(binned, CACHED_TOKEN_BINS, strict=True):
            if low <= cached and (high is None or cached <= high):
                values.append(ttft)
                break
    return [
        CachedTokensTtft(low, high, len(values), _p50(values).p50)
        for values, (low, high) in zip(binned, CACHED_TOKEN_BINS, strict=True)
    ]


PROMPT_TOKEN_BINS: tuple[tuple[int, int | None], ...] = CACHED_TOKEN_BINS[1:]
"""Bins of prompt length, ``(min, max)`` tokens inclusive: up to two blocks, then doubling."""


def ttft_by_prompt_tokens(samples: Iterable[tuple[int, CacheKind, float]]) -> list[PromptTokensTtft]:
    """Median TTFT per bin of prompt length (``PROMPT_TOKEN_BINS``) and cache outcome, every bin
    listed: a hit's TTFT is compared with misses of its own length, not with short ones.

    Args:
        samples: ``(prompt tokens, cache outcome, TTFT in seconds)``.

    Returns:
        One row per bin, shortest prompts first.
    """
    binned: list[dict[CacheKind, list[float]]] = [defaultdict(list) for _ in PROMPT_TOKEN_BINS]
    for tokens, kind, ttft in samples:
        for values, (low, high) in zip(binned, PROMPT_TOKEN_BINS, strict=True):
            if low <= tokens and (high is None or tokens <= high):
                values[kind].append(ttft)
                break
    return [
        PromptTokensTtft(low, high, *(_p50(values[kind]) for kind in KINDS))
        for values, (low, high) in zip(binned, PROMPT_TOKEN_BINS, strict=True)
    ]
