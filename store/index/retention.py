"""Retention classes of cached blocks: the byte budget evicts every block of a lower class before
any of a higher one, least recently used first within a class.

A class is carried in the LRU score itself (``CLASS_AGE_S`` apart), so one sorted set per
namespace orders the whole eviction, Redis' Lua scripts (``store.index.redis.retention``)
and the in-memory index alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from store.index.base import TAIL_AGE_S

RETENTION_CLASSES = (("short", 300), ("standard", 3600), ("long", None), ("pinned", None))
"""Retention classes, lowest first, each with the longest TTL (seconds) it takes (None: any): a
block's class is that of the time it is still promised (its TTL when stored or last hit: a
``5m`` breakpoint's blocks are short; the server's hour standard; a ``24h`` retention long),
except ``pinned``: the blocks of a named cache (``store.index.pins``) until it expires. The byte
budget evicts every block of a lower class before any of a higher one (least recently used first
within a class): an agent that asked for a longer retention keeps its prefix while plain traffic
churns. It never evicts a pinned block: those have a budget of their own."""
PINNED = len(RETENTION_CLASSES) - 1
"""The index of the pinned class."""
CLASS_AGE_S = 2e9
"""Seconds between the LRU scores of adjacent classes (about 63 years: more than tails' setback,
so a class's tails and blocks both go before the next class's; scores stay within a double's
microsecond precision)."""
PIN_OFFSET = (PINNED - 1) * CLASS_AGE_S
"""What a pinned block adds to its LRU score."""


def retention_class(ttl_s: float) -> int:
    """The index in ``RETENTION_CLASSES`` of a block promised ``ttl_s`` more seconds (not pinned)."""
    return next(i for i, (_, most) in enumerate(RETENTION_CLASSES) if most is None or ttl_s <= most)


def pinned_floor(now: float) -> float:
    """The lowest LRU score a pinned block can have at Unix time ``now``: eviction reads below it."""
    return class_middle(now, PINNED) - CLASS_AGE_S / 2


def lru_offset(ttl_s: float) -> float:
    """What a block promised ``ttl_s`` more seconds adds to its LRU score (``CLASS_AGE_S`` per class
    above ``standard``, negative below it)."""
    return (retention_class(ttl_s) - 1) * CLASS_AGE_S


def class_counts(scores: Iterable[float], now: float) -> list[int]:
    """How many of the LRU ``scores`` fall in each class (lowest first), at Unix time ``now``."""
    counts = [0] * len(RETENTION_CLASSES)
    for score in scores:
        k = math.floor((score - class_middle(now, 1)) / CLASS_AGE_S + 0.5) + 1
        counts[min(len(counts) - 1, max(0, k))] += 1
    return counts


def class_middle(now: float, k: int) -> float:
    """The middle of class ``k``'s scores at Unix time ``now``: between its blocks used now and
    its tails (``TAIL_AGE_S`` older); all of the class lies within ``CLASS_AGE_S / 2`` of it."""
    return now + (k - 1) * CLASS_AGE_S - TAIL_AGE_S / 2
