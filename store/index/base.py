"""What the cache's facade needs of its metadata parts: the block index, the shared counters and
the hot prefixes kept beside it.

``store.index.redis`` implements them on Redis (raising ``redis.RedisError`` for a fault, which
the facade's guard turns into a miss) and ``store.index.memory`` in this process (``memory://``,
and the tests' double of Redis, so a store story runs with no Redis at all). Each index hands out
the counters, hot prefixes and pins kept beside it (``shared_counters``, ``hot_prefixes``,
``pins``: ``store.index.pins``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from hashing import BlockHash, Namespace
from store.entries import IndexEntry
from store.index.pins import Pins

BUCKET_S = 10
"""Seconds per bucket of tokens queried and hit (hit-rate windows and timelines are sums of them)."""
KEEP_S = 3700
"""Seconds a bucket is kept: an hour, and a little more."""
HOT_KEEP = 100
"""Hot prefixes kept per namespace (the least valuable go first)."""


@dataclass(frozen=True)
class Window:
    """Tokens queried and hit during a window; ``hit_rate`` is None when nothing was queried."""

    queried: int
    hit: int

    @property
    def hit_rate(self) -> float | None:
        return self.hit / self.queried if self.queried else None


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


TAIL_AGE_S = 1e9
"""Seconds a tail's LRU score is set back (about 30 years): a tail is a leaf, so the budget
evicts every tail (least recently used first) before any block."""
TAILS_PER_TIP = 16
"""Most tails listed after one tip (the ones expiring last are kept): a lookup reads them all."""


class Publication(NamedTuple):
    """One block (or tail) to index (``BlockIndex.publish``).

    Attributes:
        block_hash, parent: the block's hash and its parent's (None for block 0); a tail's hash
            and its tip (None: the namespace root).
        position: the block's index in its chain (deeper blocks are evicted first); a tail's is
            that of the block it would be (and its LRU score ``TAIL_AGE_S`` older).
        entry: what the index records (the blob's name, bytes, parent, creation time, and
            ``tail``, a tail's length in tokens).
        ttl_s: seconds the entry stays without a hit.
        used_at: Unix time (seconds) of the request that computed the block (its LRU position).
        short_hash: a tail's ``hashing.short_tail_hash`` (None for a block or a one-token tail).
        token_ids: a tail's token ids, listed with it (empty for a block).
    """

    block_hash: BlockHash
    parent: BlockHash | None
    position: int
    entry: IndexEntry
    ttl_s: int
    used_at: float
    short_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()


class TailListing(NamedTuple):
    """A tail the index lists after a tip: its hash, its length in tokens, the hash of its first
    ``length - 1`` tokens (None for a one-token tail), and its token ids (None when the listing
    has none: one written before they were listed). The ids only choose which tail to read and
    how much of it: what is served is verified against its blob (``store.serde.decode_tail``)."""

    tail_hash: BlockHash
    length: int
    short_hash: BlockHash | None
    token_ids: tuple[int, ...] | None = None


class Matched(NamedTuple):
    """What ``BlockIndex.match`` found: the entries of the leading blocks present, whether the
    first missing one was stored once (it expired or was evicted) rather than never seen, the
    tails listed after the last entry's block (after the root when there is none), and, when
    every block was present, the length of the longest candidate tail with an entry (0: none)."""

    entries: list[IndexEntry]
    seen: bool
    tails: list[TailListing]
    candidate: int = 0


class BlockIndex(Protocol):
    """The index of blocks: an entry per block with a TTL, LRU order, sizes and their total.

    Contract (each method is atomic with respect to other processes sharing the index):
    - ``match`` never writes an entry; it refreshes the TTL (never shortening it) and LRU position
      of the entries it returns, which lead the chain and stop at the first missing one, and
      lists the live tails after them (``TAILS_PER_TIP`` at most per tip: the exact candidates
      find the others); ``touch`` refreshes the one tail a lookup then serves.
    - ``publish`` is create-only: a second publish of one block changes nothing.
    - ``missing`` and ``publish`` take a batch: one round trip however many blocks.
    - ``evict`` removes least recently used entries (the tail of a chain before its head) until
      at most ``max_bytes`` are accounted besides the pinned ones (``pins``:
      ``store.index.pins.Pins``), which it never removes, a namespace holding more than
      ``namespace_max_bytes`` of them (a tenant past its share) giving up its own first; evicting
      nothing is a no-op. It
      returns the members removed, whose blobs the caller deletes; so do ``reclaim`` and ``drop``.
    """

    key_prefix: str

    @property
    def pins(self) -> Pins: ...

    def match(
        self,
        namespace: Namespace,
        hashes: Sequence[BlockHash],
        ttls: Sequence[int],
        candidates: Sequence[BlockHash] = (),
    ) -> Matched:
        """Entries of the leading blocks present (each one's TTL refreshed to at least its own
        ``ttls[i]`` seconds), whether the first missing one was stored once, the tails listed
        after the last one present, and when all are present, the longest of ``candidates``
        (``candidates[j - 1]``: the tail of j tokens that would continue the prompt) with an
        entry, listed or not (``Matched``)."""
        ...

    def touch(
        self, namespace: Namespace, tip: BlockHash | None, tail_hash: BlockHash, ttl_s: int, position: int
    ) -> None:
        """Refresh a served tail's TTL to at least ``ttl_s`` seconds and its LRU position (at
        chain ``position``); a tail without an entry is skipped."""
        ...

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]: ...

    def publish(self, namespace: Namespace, blocks: Sequence[Publication]) -> int:
        """Index blocks whose blobs are complete, in the given order (one round trip, each block
        atomically); returns the bytes accounted now, over every namespace."""
        ...

    def evict(self, max_bytes: int, namespace_max_bytes: int | None = None) -> list[str]: ...

    def prune_tails(self) -> None:
        """Drop the listings of expired tails (a lookup also drops those after the tip it reads;
        this reaches tips no lookup reads again)."""
        ...

    def reclaim(self, members: Sequence[str], *, force: bool) -> list[str]:
        """Forget members whose entry is gone (all given, with ``force``)."""
        ...

    def promote(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Clear the imported mark of the blocks' entries (their TTLs kept); a block without an
        entry is skipped."""
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

    def retention_counts(self) -> list[int]:
        """Blocks (and tails) held per retention class (``store.index.retention``), lowest first."""
        ...

    def ping(self) -> None: ...

    def shared_counters(self) -> Counters:
        """The deployment-wide counters kept beside this index."""
        ...

    def hot_prefixes(self) -> HotPrefixes:
        """The hot prefixes kept beside this index."""
        ...


@dataclass(frozen=True)
class HotPrefix:
    """One cached prefix and what it saved.

    Attributes:
        root: hash of its block 0 (whose blob holds its first 128 token ids).
        blocks: its length in blocks.
        hits: counted lookups whose deepest matched block was its last one.
        tokens_saved: prompt tokens those hits reused.
        ttl_s: seconds its last block stays cached unless hit again (None: no expiry).
        block_bytes: bytes of its last block's blob.
    """

    namespace: Namespace
    root: BlockHash
    blocks: int
    hits: int
    tokens_saved: int
    ttl_s: int | None
    block_bytes: int


class HotPrefixes(Protocol):
    """Where hot prefixes are counted. Each method may raise the backend's fault (``redis.RedisError``)."""

    def record(
        self, namespace: Namespace, root: BlockHash, deepest: BlockHash, blocks: int, tokens: int
    ) -> None:
        """Count one hit that reused ``tokens`` tokens of the ``blocks`` blocks ending at
        ``deepest`` (block 0: ``root``)."""
        ...

    def top(self, namespace: Namespace | None, n: int) -> list[HotPrefix]:
        """The ``n`` prefixes still cached that saved the most tokens, of one namespace or all."""
        ...

    def namespaces(self) -> list[str]:
        """Hex of every namespace that stored a block (the index's set)."""
        ...
