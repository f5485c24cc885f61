"""Pinned blocks in the in-memory index: ``store.index.redis.pins``' contract on a
``store.index.memory.index.MemoryIndex``'s dictionaries, under its lock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hashing import BlockHash, Namespace
from store.entries import member_name
from store.index.retention import PIN_OFFSET, Pinning

if TYPE_CHECKING:
    from store.index.memory.index import MemoryIndex


class MemoryPins:
    """Pin and unpin chains of blocks of ``index`` (see ``store.index.redis.pins.RedisPins``)."""

    def __init__(self, index: MemoryIndex) -> None:
        self.index = index

    def pin(self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int) -> Pinning:
        x, members = self.index, [member_name(namespace, h) for h in hashes]
        added = held = missing = 0
        with x._lock:
            for i, member in enumerate(members):
                x.pinned[member] = x.pinned.get(member, 0) + 1
                added += x.sizes.get(member, 0) if x.pinned[member] == 1 else 0
                if x._entry(member) is None:
                    missing += 1
                    continue
                entry, expires = x.entries_[member]
                x.entries_[member] = (entry, max(expires, x.clock() + ttl_s))
                held += x.sizes.get(member, 0)
                x.lru[member] = x.clock() - i * 1e-6 + PIN_OFFSET
        return Pinning(added, held, missing)

    def unpin(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Release one pin of each block; those no named cache pins take their TTL's class again."""
        x = self.index
        with x._lock:
            for i, member in enumerate(member_name(namespace, h) for h in hashes):
                if member not in x.pinned:
                    continue
                x.pinned[member] -= 1
                if x.pinned[member] <= 0:
                    del x.pinned[member]
                    if member in x.lru:
                        expires = x.entries_.get(member, (None, 0.0))[1]
                        x.lru[member] = x.clock() - i * 1e-6 + x._offset(member, expires)

    def pinned_bytes(self) -> int:
        with self.index._lock:
            return sum(self.index.sizes.get(m, 0) for m in self.index.pinned)
