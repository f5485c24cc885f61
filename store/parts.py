"""What the cache's facade needs of its metadata parts: the block index and the shared counters.

``store.index.RedisIndex`` and ``store.counters.SharedCounters`` implement them on Redis (and
raise ``redis.RedisError`` for a fault, which the facade's guard turns into a miss); the tests'
in-memory doubles implement them too, so a store story runs with no Redis at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from hashing import BlockHash, Namespace
from store.entries import IndexEntry


class Window(Protocol):
    """Tokens queried and hit during a window."""

    @property
    def queried(self) -> int: ...

    @property
    def hit(self) -> int: ...

    @property
    def hit_rate(self) -> float | None: ...


class Counters(Protocol):
    """Deployment-wide counters, summed over every process sharing them; ``scope`` None is the
    deployment, else a namespace's hex digest."""

    def add(self, namespace_hex: str | None, counts: dict[str, int]) -> None:
        """Add ``counts`` to the deployment's totals and to ``namespace_hex``'s; ``prompt_tokens``
        and ``cached_tokens`` also go to the current 10-second bucket."""
        ...

    def totals(self, scope: str | None = None) -> dict[str, int]: ...

    def buckets(self, scope: str | None, seconds: int) -> Sequence[tuple[int, Window]]:
        """``(bucket start in Unix seconds, window)`` for each bucket of the last ``seconds``."""
        ...

    def window(self, scope: str | None, seconds: int) -> Window: ...


class BlockIndex(Protocol):
    """The index of blocks: an entry per block with a TTL, LRU order, sizes and their total.

    Contract (each method is atomic with respect to other processes sharing the index):
    - ``match`` never writes an entry; it refreshes the TTL (never shortening it) and LRU position
      of the entries it returns, which lead the chain and stop at the first missing one.
    - ``publish`` is create-only: a second publish of one block changes nothing.
    - ``evict`` removes least recently used entries (the tail of a chain before its head) until
      at most ``max_bytes`` are accounted; evicting nothing is a no-op. It returns the members
      removed, whose blobs the caller deletes; so do ``reclaim`` and ``drop``.
    """

    key_prefix: str

    def match(
        self, namespace: Namespace, hashes: Sequence[BlockHash], ttls: Sequence[int]
    ) -> tuple[list[IndexEntry], bool]:
        """Entries of the leading blocks present (each one's TTL refreshed to at least its own
        ``ttls[i]`` seconds), and whether the first missing one was stored once (it expired or
        was evicted) rather than never seen."""
        ...

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]: ...

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
        """Index a block whose blob is complete; returns the bytes accounted now."""
        ...

    def evict(self, max_bytes: int) -> list[str]: ...

    def reclaim(self, members: Sequence[str], *, force: bool) -> list[str]:
        """Forget members whose entry is gone (all given, with ``force``)."""
        ...

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None: ...

    def members(self, batch: int = 1000, namespace: Namespace | None = None) -> Iterator[list[str]]:
        """Every accounted member (of every namespace, or of one), in batches."""
        ...

    def entries(self, members: Sequence[str]) -> list[IndexEntry | None]: ...

    def known(self, members: Sequence[str]) -> list[bool]:
        """Whether each member is accounted (has a size record), entry expired or not."""
        ...

    def children(self, namespace: Namespace, parent: BlockHash | None) -> list[BlockHash]:
        """Blocks stored under ``parent`` (None: first blocks) whose entry still exists."""
        ...

    def total_bytes(self) -> int: ...

    def num_blocks(self) -> int: ...

    def ping(self) -> None: ...

    def shared_counters(self) -> Counters:
        """The deployment-wide counters kept beside this index."""
        ...
