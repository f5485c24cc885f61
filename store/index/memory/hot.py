"""Hot prefixes in this process (``memory://``), on the index's ``MemoryTables``: the contract of
``store.index.base.HotPrefixes``."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from hashing import BlockHash, Namespace
from store.entries import member_name, parse_member
from store.index.base import HOT_KEEP, HotPrefix
from store.index.memory.tables import MemoryTables


@dataclass
class _Tally:
    tokens_saved: int
    hits: int
    root: BlockHash
    blocks: int


class MemoryHotPrefixes:
    """``HotPrefixes`` in this process, beside the index whose ``tables`` give entries and TTLs."""

    def __init__(self, tables: MemoryTables) -> None:
        self.tables = tables
        self._tallies: dict[str, _Tally] = {}  # by the deepest block's member name
        self._lock = threading.Lock()

    def record(
        self, namespace: Namespace, root: BlockHash, deepest: BlockHash, blocks: int, tokens: int
    ) -> None:
        with self._lock:
            tally = self._tallies.setdefault(member_name(namespace, deepest), _Tally(0, 0, root, blocks))
            tally.tokens_saved += tokens
            tally.hits += 1
            mine = [m for m in self._tallies if m.startswith(namespace.hex())]
            mine.sort(key=lambda m: self._tallies[m].tokens_saved)
            for member in mine[: max(0, len(mine) - HOT_KEEP)]:
                del self._tallies[member]

    def namespaces(self) -> list[str]:
        return self.tables.namespaces()

    def top(self, namespace: Namespace | None, n: int) -> list[HotPrefix]:
        alive: list[HotPrefix] = []
        with self._lock:
            for member, t in list(self._tallies.items()):
                ns = parse_member(member)[0]
                if namespace is not None and ns != namespace:
                    continue
                lease = self.tables.lease(member)
                if lease is None:
                    del self._tallies[member]
                    continue
                entry, ttl = lease
                alive.append(HotPrefix(ns, t.root, t.blocks, t.hits, t.tokens_saved, int(ttl), entry.size))
        return sorted(alive, key=lambda p: -p.tokens_saved)[:n]
