"""The in-memory index's tables (``memory://``): what ``MemoryIndex``, ``MemoryPins`` and
``MemoryHotPrefixes`` share, as the Redis backend's parts share one server and its keys
(``store.index.redis.keys``).

One re-entrant lock guards every table: a caller holds it across a whole operation, so each
operation is atomic, as a Lua script is in Redis. The helpers here expect it held, except
``lease`` and ``namespaces``, which take it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hashing import BlockHash, Namespace
from store.entries import IndexEntry
from store.index.base import TailListing
from store.index.retention import PIN_OFFSET, lru_offset

TailTable = dict[tuple[Namespace, BlockHash | None], dict[BlockHash, tuple[TailListing, float]]]
"""``(namespace, tip or None)`` -> ``{tail hash: (listing, expires at)}``."""


@dataclass
class MemoryTables:
    """The index's state, with TTLs on ``clock`` (Unix seconds).

    Attributes:
        entries: member -> (its entry, when it expires).
        lru: member -> LRU score (the lowest is evicted first), for every accounted member.
        sizes: member -> blob bytes, for every accounted member.
        seen: members stored once (to tell an expired block from one never seen).
        parents: member -> its parent's member ("" for block 0).
        tails: the tails listed after each tip.
        pinned: member -> named caches pinning it (``store.index.pins``).
    """

    clock: Callable[[], float] = time.time
    entries: dict[str, tuple[IndexEntry, float]] = field(default_factory=dict)
    lru: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    parents: dict[str, str] = field(default_factory=dict)
    tails: TailTable = field(default_factory=dict)
    pinned: dict[str, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def entry(self, member: str) -> IndexEntry | None:
        """``member``'s entry, or None when it has none or it expired (then dropped)."""
        found = self.entries.get(member)
        if found is None or found[1] <= self.clock():
            self.entries.pop(member, None)
            return None
        return found[0]

    def offset(self, member: str, expires: float) -> float:
        """What ``member``'s LRU score adds for its class: pinned, or that of a TTL to ``expires``
        (``store.index.retention``)."""
        return PIN_OFFSET if member in self.pinned else lru_offset(expires - self.clock())

    def lease(self, member: str) -> tuple[IndexEntry, float] | None:
        """``member``'s entry and the seconds it has left, or None when it is gone."""
        with self.lock:
            entry = self.entry(member)
            return None if entry is None else (entry, self.entries[member][1] - self.clock())

    def namespaces(self) -> list[str]:
        """Hex of every namespace with an accounted member, sorted."""
        with self.lock:
            return sorted({m.partition(":")[0] for m in self.lru})
