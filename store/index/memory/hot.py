"""Hot prefixes in this process (``memory://``), beside a ``MemoryIndex``: the contract of
``store.index.base.HotPrefixes``."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hashing import BlockHash, Namespace
from store.entries import member_name, parse_member
from store.index.base import HOT_KEEP, HotPrefix

if TYPE_CHECKING:
    from store.index.memory.index import MemoryIndex


@dataclass
class _Tally:
    tokens_saved: int
    hits: int
    root: BlockHash
    blocks: int


class MemoryHotPrefixes:
    """``HotPrefixes`` in this process, beside a ``MemoryIndex`` (whose clock gives TTLs)."""

    def __init__(self, index: MemoryIndex) -> None:
        self.index = index
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
        return sorted({m.partition(":")[0] for batch in self.index.members() for m in batch})

    def top(self, namespace: Namespace | None, n: int) -> list[HotPrefix]:
        alive: list[HotPrefix] = []
        with self._lock:
            for member, t in list(self._tallies.items()):
                ns = parse_member(member)[0]
                if namespace is not None and ns != namespace:
                    continue
                lease = self.index.lease(member)
                if lease is None:
                    del self._tallies[member]
                    continue
                entry, ttl = lease
                alive.append(HotPrefix(ns, t.root, t.blocks, t.hits, t.tokens_saved, int(ttl), entry.size))
        return sorted(alive, key=lambda p: -p.tokens_saved)[:n]
