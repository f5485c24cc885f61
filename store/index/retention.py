"""Retention classes of cached blocks: the byte budget evicts every block of a lower class before
any of a higher one, least recently used first within a class.

A class is carried in the LRU score itself (``CLASS_AGE_S`` apart), so one sorted set per
namespace orders the whole eviction, Redis' Lua scripts (``RETENTION``)
and the in-memory index alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import redis

from hashing import BlockHash, Namespace
from store.index.base import TAIL_AGE_S

RETENTION_CLASSES = (("short", 300), ("standard", 3600), ("long", None), ("pinned", None))
"""Retention classes, lowest first, each with the longest TTL (seconds) it takes (None: any): a
block's class is that of the time it is still promised (its TTL when stored or last hit: a
``5m`` breakpoint's blocks are short; the server's hour standard; a ``24h`` retention long),
except ``pinned``: the blocks of a named cache (``store.named``) until it expires. The byte
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
    return _middle(now, PINNED) - CLASS_AGE_S / 2


def lru_offset(ttl_s: float) -> float:
    """What a block promised ``ttl_s`` more seconds adds to its LRU score (``CLASS_AGE_S`` per class
    above ``standard``, negative below it)."""
    return (retention_class(ttl_s) - 1) * CLASS_AGE_S


# RETENTION: a block's LRU offset from the seconds it is still promised (a TTL of -1, no
# expiry, is the longest), as ``lru_offset`` computes it; PIN a pinned one's.
_BANDS = [(most, (i - 1) * CLASS_AGE_S) for i, (_, most) in enumerate(RETENTION_CLASSES[:PINNED])]
RETENTION = (
    f"local PIN = {PIN_OFFSET!r}\nlocal function lru_offset(ttl)\n"
    + "".join(f"  if ttl >= 0 and ttl <= {most} then return {offset!r} end\n" for most, offset in _BANDS[:-1])
    + f"  return {_BANDS[-1][1]!r}\nend\n"
)


def class_counts(scores: Iterable[float], now: float) -> list[int]:
    """How many of the LRU ``scores`` fall in each class (lowest first), at Unix time ``now``."""
    counts = [0] * len(RETENTION_CLASSES)
    for score in scores:
        k = math.floor((score - _middle(now, 1)) / CLASS_AGE_S + 0.5) + 1
        counts[min(len(counts) - 1, max(0, k))] += 1
    return counts


def _middle(now: float, k: int) -> float:
    """The middle of class ``k``'s scores at Unix time ``now``: between its blocks used now and
    its tails (``TAIL_AGE_S`` older); all of the class lies within ``CLASS_AGE_S / 2`` of it."""
    return now + (k - 1) * CLASS_AGE_S - TAIL_AGE_S / 2


def sorted_set_counts(client: redis.Redis, lru_keys: Sequence[str]) -> list[int]:
    """``class_counts`` of the sorted sets ``lru_keys`` now, counted in Redis (one pipelined round
    trip per node)."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for key in lru_keys:
        for k in range(len(RETENTION_CLASSES)):
            middle = _middle(now, k)
            pipe.zcount(key, f"({middle - CLASS_AGE_S / 2}", middle + CLASS_AGE_S / 2)
    found = [int(n) for n in pipe.execute()] if lru_keys else []
    return [sum(found[k :: len(RETENTION_CLASSES)]) for k in range(len(RETENTION_CLASSES))]


class Pinning(NamedTuple):
    """What ``Pins.pin`` did: bytes newly pinned (a block pinned already is not new), bytes of
    the chain's stored blocks, and how many of its blocks are not stored (yet)."""

    added: int
    held: int
    missing: int


class Pins(Protocol):
    """Pinned blocks: those of named caches (``store.named``), which the byte budget never evicts
    (``store.index.retention.PINNED``); their bytes are counted apart. Methods may raise the
    backend's fault."""

    def pin(self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int) -> Pinning:
        """Pin the chain ``hashes``: those stored have their TTL raised to ``ttl_s`` seconds at
        least; those not stored yet are pinned as they are published."""
        ...

    def unpin(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Release one pin of each block: one no pin holds takes its TTL's class again."""
        ...

    def pinned_bytes(self) -> int:
        """Bytes of the pinned blocks, over every namespace."""
        ...
