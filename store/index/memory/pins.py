"""Pinned blocks in the in-memory index: the contract of ``store.index.pins.Pins`` on the
index's ``MemoryTables``, under their lock (as ``store.index.redis.pins`` on its Redis keys)."""

from __future__ import annotations

from collections.abc import Sequence

from hashing import BlockHash, Namespace
from store.entries import member_name
from store.index.memory.tables import MemoryTables
from store.index.pins import Pinning
from store.index.retention import PIN_OFFSET


class MemoryPins:
    """Pin and unpin chains of blocks in ``tables`` (see ``store.index.redis.pins.RedisPins``)."""

    def __init__(self, tables: MemoryTables) -> None:
        self.tables = tables

    def pin(self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int) -> Pinning:
        t, members = self.tables, [member_name(namespace, h) for h in hashes]
        added = held = missing = 0
        with t.lock:
            for i, member in enumerate(members):
                t.pinned[member] = t.pinned.get(member, 0) + 1
                added += t.sizes.get(member, 0) if t.pinned[member] == 1 else 0
                if t.entry(member) is None:
                    missing += 1
                    continue
                entry, expires = t.entries[member]
                t.entries[member] = (entry, max(expires, t.clock() + ttl_s))
                held += t.sizes.get(member, 0)
                t.lru[member] = t.clock() - i * 1e-6 + PIN_OFFSET
        return Pinning(added, held, missing)

    def unpin(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Release one pin of each block; those no named cache pins take their TTL's class again."""
        t = self.tables
        with t.lock:
            for i, member in enumerate(member_name(namespace, h) for h in hashes):
                if member not in t.pinned:
                    continue
                t.pinned[member] -= 1
                if t.pinned[member] <= 0:
                    del t.pinned[member]
                    if member in t.lru:
                        expires = t.entries.get(member, (None, 0.0))[1]
                        t.lru[member] = t.clock() - i * 1e-6 + t.offset(member, expires)

    def pinned_bytes(self) -> int:
        t = self.tables
        with t.lock:
            return sum(t.sizes.get(m, 0) for m in t.pinned)
