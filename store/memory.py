"""The index and counters in this process's memory (``--redis-url memory://``): the contract of
``store.parts`` without Redis, for a single process (nothing is shared with other processes, and
a restart forgets the index; the blobs stay and the garbage collector reclaims them). Tests use
it as the in-memory double of Redis, with a clock they control.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hashing import BlockHash, Namespace
from store.counters import BUCKET_S, KEEP_S
from store.entries import IndexEntry, member_name, parse_member

T = TypeVar("T")


class Clock:
    """Seconds that pass only when told to (for tests)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class MemoryWindow:
    queried: int
    hit: int

    @property
    def hit_rate(self) -> float | None:
        return self.hit / self.queried if self.queried else None


class MemoryCounters:
    """``store.parts.Counters`` in memory: totals, and tokens queried and hit per 10-second bucket
    for the last hour (the layout of ``store.counters``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._totals: dict[str | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._buckets: dict[tuple[str | None, int], list[int]] = defaultdict(lambda: [0, 0])
        self._lock = threading.Lock()

    def add(self, namespace_hex: str | None, counts: dict[str, int]) -> None:
        bucket = int(self.clock()) // BUCKET_S
        with self._lock:
            for scope in {None, namespace_hex}:
                for name, delta in counts.items():
                    self._totals[scope][name] += delta
                if counts.get("prompt_tokens"):
                    window = self._buckets[scope, bucket]
                    window[0] += counts["prompt_tokens"]
                    window[1] += counts.get("cached_tokens", 0)
            for key in [k for k in self._buckets if k[1] < bucket - KEEP_S // BUCKET_S]:
                del self._buckets[key]

    def totals(self, scope: str | None = None) -> dict[str, int]:
        with self._lock:
            return dict(self._totals[scope])

    def buckets(self, scope: str | None, seconds: int) -> list[tuple[int, MemoryWindow]]:
        now = int(self.clock()) // BUCKET_S
        with self._lock:
            found = {
                b: self._buckets.get((scope, b), [0, 0])
                for b in range(now - seconds // BUCKET_S + 1, now + 1)
            }
        return [(b * BUCKET_S, MemoryWindow(q, h)) for b, (q, h) in found.items()]

    def window(self, scope: str | None, seconds: int) -> MemoryWindow:
        windows = [w for _, w in self.buckets(scope, seconds)]
        return MemoryWindow(sum(w.queried for w in windows), sum(w.hit for w in windows))


def _locked(method: Callable[..., T]) -> Callable[..., T]:
    """Run ``method`` under the index's lock."""

    @functools.wraps(method)
    def locked(self: MemoryIndex, *args: Any, **kwargs: Any) -> T:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class MemoryIndex:
    """``store.parts.BlockIndex`` in memory, with TTLs on ``clock`` (thread-safe: one lock makes
    each method atomic, as a Lua script is in Redis)."""

    key_prefix = "memory:"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.entries_: dict[str, tuple[IndexEntry, float]] = {}  # member -> (entry, expires at)
        self.lru: dict[str, float] = {}  # member -> score (older first out)
        self.sizes: dict[str, int] = {}
        self.seen: set[str] = set()
        self.parents: dict[str, str] = {}  # member -> parent member ("" for block 0)
        self.counters = MemoryCounters(clock)
        self._lock = threading.RLock()

    def _entry(self, member: str) -> IndexEntry | None:
        found = self.entries_.get(member)
        if found is None or found[1] <= self.clock():
            self.entries_.pop(member, None)
            return None
        return found[0]

    @_locked
    def match(
        self, namespace: Namespace, hashes: Sequence[BlockHash], ttls: Sequence[int]
    ) -> tuple[list[IndexEntry], bool]:
        out: list[IndexEntry] = []
        for i, h in enumerate(hashes):
            member = member_name(namespace, h)
            entry = self._entry(member)
            if entry is None:
                return out, member in self.seen
            expires = max(self.entries_[member][1], self.clock() + ttls[i])
            self.entries_[member] = (entry, expires)
            self.lru[member] = self.clock() - i * 1e-6
            out.append(entry)
        return out, False

    @_locked
    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        return [self._entry(member_name(namespace, h)) is None for h in hashes]

    @_locked
    def publish(
        self,
        namespace: Namespace,
        block_hash: BlockHash,
        parent: BlockHash | None,
        index: int,
        entry: IndexEntry,
        ttl_s: int,
        used_at: float,
    ) -> int:
        member = member_name(namespace, block_hash)
        if self._entry(member) is None:
            self.entries_[member] = (entry, self.clock() + ttl_s)
            self.lru[member] = used_at - index * 1e-6
            self.sizes.setdefault(member, entry.size)
            self.seen.add(member)
            self.parents[member] = member_name(namespace, parent) if parent is not None else ""
        return self.total_bytes()

    @_locked
    def evict(self, max_bytes: int) -> list[str]:
        evicted = []
        while self.total_bytes() > max_bytes and self.lru:
            member = min(self.lru, key=self.lru.__getitem__)
            self._forget(member)
            evicted.append(member)
        return evicted

    @_locked
    def reclaim(self, members: Sequence[str], *, force: bool) -> list[str]:
        removed = [m for m in members if force or self._entry(m) is None]
        for member in removed:
            self._forget(member)
        return removed

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        self.reclaim([member_name(namespace, block_hash)], force=True)

    def _forget(self, member: str) -> None:
        self.entries_.pop(member, None)
        self.lru.pop(member, None)
        self.sizes.pop(member, None)

    def members(self, batch: int = 1000, namespace: Namespace | None = None) -> Iterator[list[str]]:
        with self._lock:
            members = [m for m in self.lru if namespace is None or m.startswith(f"{namespace.hex()}:")]
        for start in range(0, len(members), batch):
            yield members[start : start + batch]

    @_locked
    def entries(self, members: Sequence[str]) -> list[IndexEntry | None]:
        return [self._entry(m) for m in members]

    @_locked
    def known(self, members: Sequence[str]) -> list[bool]:
        return [m in self.sizes for m in members]

    @_locked
    def children(self, namespace: Namespace, parent: BlockHash | None) -> list[BlockHash]:
        want = member_name(namespace, parent) if parent is not None else ""
        return [
            parse_member(m)[1]
            for m, p in self.parents.items()
            if p == want and parse_member(m)[0] == namespace and self._entry(m) is not None
        ]

    @_locked
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    @_locked
    def num_blocks(self) -> int:
        return len(self.lru)

    def ping(self) -> None:
        return None

    def shared_counters(self) -> MemoryCounters:
        return self.counters
