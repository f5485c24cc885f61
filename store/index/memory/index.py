"""The index in this process's memory (``--redis-url memory://``): the contract of
``store.index.base.BlockIndex`` without Redis, for a single process (nothing is shared with other
processes, and a restart forgets the index; the blobs stay and the garbage collector reclaims
them). Tests use it as the in-memory double of Redis, with a clock they control.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from hashing import BlockHash, Namespace
from store.entries import IndexEntry, member_name, parse_member
from store.index.base import TAIL_AGE_S, TAILS_PER_TIP, Matched, Publication, TailListing
from store.index.memory.counters import MemoryCounters
from store.index.memory.hot import MemoryHotPrefixes
from store.index.memory.pins import MemoryPins
from store.index.memory.tables import MemoryTables
from store.index.retention import class_counts, lru_offset

T = TypeVar("T")

MEMORY_URL = "memory://"
"""``--redis-url memory://``: the index in this process (this module), for one process alone."""


def _locked(method: Callable[..., T]) -> Callable[..., T]:
    """Run ``method`` under the tables' lock."""

    @functools.wraps(method)
    def locked(self: MemoryIndex, *args: Any, **kwargs: Any) -> T:
        with self.tables.lock:
            return method(self, *args, **kwargs)

    return locked


class MemoryIndex:
    """``store.index.base.BlockIndex`` in memory, with TTLs on ``clock`` (thread-safe: the tables'
    lock makes each method atomic, as a Lua script is in Redis). Its pins and hot prefixes share
    its ``tables`` (``store.index.memory.tables``)."""

    key_prefix = "memory:"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.tables = MemoryTables(clock)
        self.pins = MemoryPins(self.tables)
        self.counters = MemoryCounters(clock)
        self.hot = MemoryHotPrefixes(self.tables)

    @_locked
    def match(
        self,
        namespace: Namespace,
        hashes: Sequence[BlockHash],
        ttls: Sequence[int],
        candidates: Sequence[BlockHash] = (),
    ) -> Matched:
        t = self.tables
        out: list[IndexEntry] = []
        seen = False
        for i, h in enumerate(hashes):
            member = member_name(namespace, h)
            entry = t.entry(member)
            if entry is None:
                seen = member in t.seen
                break
            expires = max(t.entries[member][1], t.clock() + ttls[i])
            t.entries[member] = (entry, expires)
            t.lru[member] = t.clock() - i * 1e-6 + t.offset(member, expires)
            out.append(entry)
        tip = hashes[len(out) - 1] if out else None
        listed = [listing for listing, _ in self._tails(namespace, tip).values()]
        present = [j for j, h in enumerate(candidates, 1) if t.entry(member_name(namespace, h))]
        candidate = max(present, default=0) if len(out) == len(hashes) else 0
        return Matched(out, seen, listed, candidate)

    def _tails(
        self, namespace: Namespace, tip: BlockHash | None
    ) -> dict[BlockHash, tuple[TailListing, float]]:
        """The live tails after ``tip``, those expired dropped."""
        t = self.tables
        listed = t.tails.get((namespace, tip), {})
        for h in [h for h, (_, expires) in listed.items() if expires <= t.clock()]:
            del listed[h]
        return listed

    @_locked
    def touch(
        self, namespace: Namespace, tip: BlockHash | None, tail_hash: BlockHash, ttl_s: int, position: int
    ) -> None:
        t = self.tables
        member = member_name(namespace, tail_hash)
        entry = t.entry(member)
        if entry is None:
            return
        expires = max(t.entries[member][1], t.clock() + ttl_s)
        t.entries[member] = (entry, expires)
        t.lru[member] = t.clock() - TAIL_AGE_S - position * 1e-6 + lru_offset(expires - t.clock())
        listed = self._tails(namespace, tip)
        if tail_hash in listed:
            listed[tail_hash] = (listed[tail_hash][0], expires)

    @_locked
    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        return [self.tables.entry(member_name(namespace, h)) is None for h in hashes]

    @_locked
    def publish(self, namespace: Namespace, blocks: Sequence[Publication]) -> int:
        t = self.tables
        for b in blocks:
            member = member_name(namespace, b.block_hash)
            if t.entry(member) is None:
                t.entries[member] = (b.entry, t.clock() + b.ttl_s)
                age = (TAIL_AGE_S if b.entry.tail else 0) + b.position * 1e-6
                t.lru[member] = b.used_at - age + t.offset(member, t.clock() + b.ttl_s)
                t.sizes.setdefault(member, b.entry.size)
                if b.entry.tail:
                    self._list_tail(namespace, b)
                    continue
                t.seen.add(member)
                t.parents[member] = member_name(namespace, b.parent) if b.parent is not None else ""
        return self.total_bytes()

    def _list_tail(self, namespace: Namespace, b: Publication) -> None:
        t = self.tables
        listed = t.tails.setdefault((namespace, b.parent), {})
        self._tails(namespace, b.parent)
        listing = TailListing(b.block_hash, b.entry.tail, b.short_hash, b.token_ids)
        listed[b.block_hash] = (listing, t.clock() + b.ttl_s)
        for h, _ in sorted(listed.items(), key=lambda item: item[1][1])[
            : max(0, len(listed) - TAILS_PER_TIP)
        ]:
            del listed[h]

    @_locked
    def prune_tails(self) -> None:
        t = self.tables
        for namespace, tip in list(t.tails):
            if not self._tails(namespace, tip):
                del t.tails[(namespace, tip)]

    @_locked
    def evict(self, max_bytes: int, namespace_max_bytes: int | None = None) -> list[str]:
        t = self.tables
        evicted = []
        unpinned = {m: score for m, score in t.lru.items() if m not in t.pinned}
        held = Counter[str]()
        for member in unpinned:
            held[member.partition(":")[0]] += t.sizes.get(member, 0)
        while self.total_bytes() - self.pins.pinned_bytes() > max_bytes and unpinned:
            ns, most = held.most_common(1)[0]
            past = namespace_max_bytes is not None and most > namespace_max_bytes
            candidates = (m for m in unpinned if not past or m.startswith(ns + ":"))
            member = min(candidates, key=unpinned.__getitem__)
            del unpinned[member]
            held[member.partition(":")[0]] -= t.sizes.get(member, 0)
            self._forget(member)
            evicted.append(member)
        return evicted

    @_locked
    def reclaim(self, members: Sequence[str], *, force: bool) -> list[str]:
        removed = [m for m in members if force or self.tables.entry(m) is None]
        for member in removed:
            self._forget(member)
        return removed

    @_locked
    def promote(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        t = self.tables
        for h in hashes:
            member = member_name(namespace, h)
            if t.entry(member) is not None:
                entry, expires = t.entries[member]
                t.entries[member] = (dataclasses.replace(entry, imported=False), expires)

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        self.reclaim([member_name(namespace, block_hash)], force=True)

    def _forget(self, member: str) -> None:
        t = self.tables
        found = t.entries.get(member)
        if found is not None and found[0].tail:
            namespace, tail_hash = parse_member(member)
            tip = BlockHash(bytes.fromhex(found[0].parent)) if found[0].parent else None
            t.tails.get((namespace, tip), {}).pop(tail_hash, None)
        t.entries.pop(member, None)
        t.lru.pop(member, None)
        t.sizes.pop(member, None)
        t.pinned.pop(member, None)

    def members(self, batch: int = 1000, namespace: Namespace | None = None) -> Iterator[list[str]]:
        t = self.tables
        with t.lock:
            members = [m for m in t.lru if namespace is None or m.startswith(f"{namespace.hex()}:")]
        for start in range(0, len(members), batch):
            yield members[start : start + batch]

    @_locked
    def entries(self, members: Sequence[str]) -> list[IndexEntry | None]:
        return [self.tables.entry(m) for m in members]

    @_locked
    def known(self, members: Sequence[str]) -> list[bool]:
        return [m in self.tables.sizes for m in members]

    @_locked
    def children(self, namespace: Namespace, parent: BlockHash | None) -> list[BlockHash]:
        t = self.tables
        want = member_name(namespace, parent) if parent is not None else ""
        return [
            parse_member(m)[1]
            for m, p in t.parents.items()
            if p == want and parse_member(m)[0] == namespace and t.entry(m) is not None
        ]

    @_locked
    def total_bytes(self) -> int:
        return sum(self.tables.sizes.values())

    @_locked
    def num_blocks(self) -> int:
        return len(self.tables.lru)

    @_locked
    def retention_counts(self) -> list[int]:
        t = self.tables
        return class_counts(t.lru.values(), t.clock())

    def ping(self) -> None:
        return None

    def shared_counters(self) -> MemoryCounters:
        return self.counters

    def hot_prefixes(self) -> MemoryHotPrefixes:
        return self.hot
