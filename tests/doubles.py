"""In-memory doubles of the store's metadata parts (``store.parts``): the same contract as the
Redis index and counters, in one process, with a clock the test controls."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hashing import BlockHash, Namespace
from store.entries import IndexEntry, member_name, parse_member


class Clock:
    """Seconds that pass only when the test says so."""

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
    """``store.parts.Counters`` in memory (one bucket: every window sees every count)."""

    def __init__(self) -> None:
        self._totals: dict[str | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, namespace_hex: str | None, counts: dict[str, int]) -> None:
        for scope in {None, namespace_hex}:
            for name, delta in counts.items():
                self._totals[scope][name] += delta

    def totals(self, scope: str | None = None) -> dict[str, int]:
        return dict(self._totals[scope])

    def buckets(self, scope: str | None, seconds: int) -> list[tuple[int, MemoryWindow]]:
        return [(0, self.window(scope, seconds))]

    def window(self, scope: str | None, seconds: int) -> MemoryWindow:
        totals = self._totals[scope]
        return MemoryWindow(totals["prompt_tokens"], totals["cached_tokens"])


class MemoryIndex:
    """``store.parts.BlockIndex`` in memory, with TTLs on ``clock``."""

    key_prefix = "memory:"

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.entries_: dict[str, tuple[IndexEntry, float]] = {}  # member -> (entry, expires at)
        self.lru: dict[str, float] = {}  # member -> score (older first out)
        self.sizes: dict[str, int] = {}
        self.seen: set[str] = set()
        self.parents: dict[str, str] = {}  # member -> parent member ("" for block 0)
        self.counters = MemoryCounters()

    def _entry(self, member: str) -> IndexEntry | None:
        found = self.entries_.get(member)
        if found is None or found[1] <= self.clock():
            self.entries_.pop(member, None)
            return None
        return found[0]

    def match(
        self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int
    ) -> tuple[list[IndexEntry], bool]:
        out: list[IndexEntry] = []
        for i, h in enumerate(hashes):
            member = member_name(namespace, h)
            entry = self._entry(member)
            if entry is None:
                return out, member in self.seen
            expires = max(self.entries_[member][1], self.clock() + ttl_s)
            self.entries_[member] = (entry, expires)
            self.lru[member] = self.clock() - i * 1e-6
            out.append(entry)
        return out, False

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        return [self._entry(member_name(namespace, h)) is None for h in hashes]

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

    def evict(self, max_bytes: int) -> list[str]:
        evicted = []
        while self.total_bytes() > max_bytes and self.lru:
            member = min(self.lru, key=self.lru.__getitem__)
            self._forget(member)
            evicted.append(member)
        return evicted

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

    def members(self, batch: int = 1000) -> Iterator[list[str]]:
        members = list(self.lru)
        for start in range(0, len(members), batch):
            yield members[start : start + batch]

    def entries(self, members: Sequence[str]) -> list[IndexEntry | None]:
        return [self._entry(m) for m in members]

    def known(self, members: Sequence[str]) -> list[bool]:
        return [m in self.sizes for m in members]

    def children(self, namespace: Namespace, parent: BlockHash | None) -> list[BlockHash]:
        want = member_name(namespace, parent) if parent is not None else ""
        return [
            parse_member(m)[1]
            for m, p in self.parents.items()
            if p == want and parse_member(m)[0] == namespace and self._entry(m) is not None
        ]

    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def num_blocks(self) -> int:
        return len(self.lru)

    def ping(self) -> None:
        return None

    def shared_counters(self) -> MemoryCounters:
        return self.counters
