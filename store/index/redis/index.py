"""The Redis index: metadata of every block, each entry with a TTL, plus LRU order and sizes.

The keys (``store.index.redis.keys``) carry their namespace as a Redis Cluster hash tag, so a chain lookup, a
publish or an eviction touches one slot (one node, one round trip), while namespaces spread over
the cluster's nodes. What is global sums over namespaces: the bytes held (the byte budget) and
the block count are the sums of every namespace's counters, read in one pipelined round trip per
node; eviction takes the globally least recently used blocks, namespace by namespace (``evict``).

Redis never holds tensors. Every change to these keys is one Lua script (``store.index.redis.scripts``), so
several processes can share them: a lookup, a publish, an eviction and a reclaim are each atomic
and one round trip.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence

import redis

from hashing import BlockHash, Namespace
from store.entries import IndexEntry, member_name
from store.index.base import Matched, Publication
from store.index.redis import scripts
from store.index.redis.counters import SharedCounters
from store.index.redis.hot import RedisHotPrefixes
from store.index.redis.keys import IndexKeys
from store.index.redis.pins import RedisPins
from store.index.redis.retention import sorted_set_counts
from store.index.redis.tails import TailListings, parse_match
from store.index.retention import pinned_floor

SEEN_TTL_S = 7 * 86_400
"""Seconds a "seen" marker outlives its block: long enough to tell "expired" from "never seen"."""
EVICT_BATCH = 64
"""Least recently used members read per eviction round trip."""


class RedisIndex:
    """Block index in Redis, one server or a Cluster (implements ``store.index.base.BlockIndex``).
    Every method may raise ``store.index.redis.connect.REDIS_ERRORS``; callers degrade."""

    def __init__(self, client: redis.Redis, key_prefix: str) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.keys = IndexKeys(key_prefix)
        self._match = client.register_script(scripts.MATCH)
        self._publish = client.register_script(scripts.PUBLISH)
        self._forget = client.register_script(scripts.FORGET)
        self._promote = client.register_script(scripts.PROMOTE)
        self.tails = TailListings(client, self.keys)
        self.pins = RedisPins(client, self.keys, self._per_namespace)
        self._hot = RedisHotPrefixes(self.client, self.keys)

    def block_key(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return self.keys.block(namespace, block_hash)

    def match(
        self,
        namespace: Namespace,
        hashes: Sequence[BlockHash],
        ttls: Sequence[int],
        candidates: Sequence[BlockHash] = (),
    ) -> Matched:
        """The leading blocks present and the tails after them (``Matched``), in one round trip on
        the namespace's node; refreshes the TTL of matched key i to at least ``ttls[i]`` seconds
        and marks it used now. An entry that does not parse ends the match (and lists no tail)."""
        keys, args = scripts.match_arguments(self.keys, namespace, hashes, ttls, candidates, time.time())
        return parse_match(self._match(keys=keys, args=args))

    def touch(
        self, namespace: Namespace, tip: BlockHash | None, tail_hash: BlockHash, ttl_s: int, position: int
    ) -> None:
        """Refresh a served tail (``store.index.redis.tails``)."""
        self.tails.touch(namespace, tip, tail_hash, ttl_s, position)

    def children(self, namespace: Namespace, parent: BlockHash | None) -> list[BlockHash]:
        """Hashes of blocks stored under ``parent`` (None: the first block of a chain) that
        still have an index entry."""
        members: set[bytes] = self.client.smembers(self.keys.children(namespace, parent))  # type: ignore[assignment]
        hashes = [BlockHash(bytes.fromhex(m.decode())) for m in members]
        missing = self.missing(namespace, hashes) if hashes else []
        return [h for h, gone in zip(hashes, missing, strict=True) if not gone]

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        """For each hash, whether the index lacks it (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for h in hashes:
            pipe.exists(self.block_key(namespace, h))
        return [not found for found in pipe.execute()]

    def publish(self, namespace: Namespace, blocks: Sequence[Publication]) -> int:
        """Index blocks whose blobs are complete: per block ``SET NX EX``, LRU position, size
        (nothing changes for a block another writer published first), all in one script (one
        namespace: one slot, one node, one round trip); returns ``total_bytes()`` then."""
        if not blocks:
            return self.total_bytes()
        ns = namespace.hex()
        self.client.sadd(self.keys.namespaces, ns)  # NOTE: first, so the budget never misses it
        keys, args = scripts.publish_arguments(self.keys, namespace, blocks, SEEN_TTL_S)
        self._publish(keys=keys, args=args)
        return self.total_bytes()

    def _namespaces(self) -> list[str]:
        return sorted(m.decode() for m in self.client.smembers(self.keys.namespaces))  # type: ignore[union-attr]

    def _per_namespace(self, command: str, rest: str) -> dict[str, int]:
        """``command`` (``get`` or ``zcard``) on key ``rest`` of every namespace: one pipelined
        round trip per node."""
        spaces = self._namespaces()
        pipe = self.client.pipeline(transaction=False)
        for ns in spaces:
            getattr(pipe, command)(self.keys.of(ns, rest))
        return {ns: int(v or 0) for ns, v in zip(spaces, pipe.execute() if spaces else [], strict=True)}

    def evict(self, max_bytes: int, namespace_max_bytes: int | None = None) -> list[str]:
        """Remove least recently used blocks until the store holds at most ``max_bytes``.

        The budget is global and leaves pinned blocks out (``store.index.redis.pins``). Each round
        reads every namespace's bytes and oldest member. A namespace holding more than
        ``namespace_max_bytes`` unpinned (a tenant past its share) gives up its own oldest first,
        the one furthest past its share first; then the namespace holding the globally oldest block
        evicts down to the next namespace's oldest (one script on that namespace's node). A member
        used since it was read is kept. Writers publishing meanwhile may overshoot by their blocks
        until the next eviction.

        Returns:
            The evicted members; their blobs are the caller's to delete.
        """
        evicted: list[str] = []
        spared: set[str] = set()  # NOTE: past its share by pinned blocks alone: nothing to take
        while True:
            held = self._per_namespace("get", "bytes")
            pinned = self._per_namespace("get", "pinned")
            excess = sum(held.values()) - sum(pinned.values()) - max_bytes
            if excess <= 0:
                return evicted
            past = {} if namespace_max_bytes is None else self._past_share(held, pinned, namespace_max_bytes)
            past = {ns: over for ns, over in past.items() if ns not in spared}
            if past:
                ns = max(past, key=past.__getitem__)
                removed = self._evict_oldest(ns, pinned_floor(time.time()), min(excess, past[ns]))
                spared |= set() if removed else {ns}
                evicted += removed
                continue
            pipe = self.client.pipeline(transaction=False)
            spaces = [ns for ns, n in held.items() if n > 0]
            for ns in spaces:
                pipe.zrange(self.keys.of(ns, "lru"), 0, 0, withscores=True)
            floor = pinned_floor(time.time())
            rows_ = zip(spaces, pipe.execute(), strict=True)
            oldest = sorted((rows[0][1], ns) for ns, rows in rows_ if rows and rows[0][1] < floor)
            if not oldest:
                return evicted
            ns, bound = oldest[0][1], min(floor, oldest[1][0] if len(oldest) > 1 else floor)
            removed = self._evict_oldest(ns, bound, excess)
            if not removed:
                return evicted
            evicted += removed

    @staticmethod
    def _past_share(held: dict[str, int], pinned: dict[str, int], share: int) -> dict[str, int]:
        """The namespaces holding more than ``share`` bytes unpinned, and by how many bytes."""
        past = {ns: n - pinned.get(ns, 0) - share for ns, n in held.items()}
        return {ns: over for ns, over in past.items() if over > 0}

    def _evict_oldest(self, ns: str, bound: float, excess: int) -> list[str]:
        """Evict namespace ``ns``'s least recently used members scored at most ``bound``, freeing
        up to ``excess`` bytes (``EVICT_BATCH`` members read at most); the members removed."""
        rows: list[tuple[bytes, float]] = self.client.zrangebyscore(  # type: ignore[assignment]
            self.keys.of(ns, "lru"), "-inf", bound, 0, EVICT_BATCH, withscores=True
        )
        return self._forget_members(ns, [(m.decode(), score) for m, score in rows], "evict", excess)

    def prune_tails(self) -> None:
        """Drop expired tails from every namespace's listings (``store.index.redis.tails``)."""
        self.tails.prune(self._namespaces())

    def _forget_members(
        self, ns: str, members: Sequence[tuple[str, float]], mode: str, budget: int = 0
    ) -> list[str]:
        keys = [
            *self.keys.accounts(ns),
            self.keys.of(ns, "tails"),
            *(self.keys.member(m) for m, _ in members),
            *self.keys.pins(ns),
        ]
        args: list[str | int] = [mode, budget]
        for member, score in members:
            args += [member, repr(float(score))]
        return [m.decode() for m in self._forget(keys=keys, args=args)]

    def reclaim(self, members: Sequence[str], *, force: bool) -> list[str]:
        """Forget members: those whose entry expired (or all given, with ``force``); one script
        per namespace.

        Returns:
            The members removed from the index; their blobs are the caller's to delete.
        """
        by_namespace: dict[str, list[tuple[str, float]]] = defaultdict(list)
        for member in members:
            by_namespace[member.partition(":")[0]].append((member, 0.0))
        removed: list[str] = []
        for ns, group in by_namespace.items():
            removed += self._forget_members(ns, group, "force" if force else "reclaim")
        return removed

    def promote(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Clear the imported mark of blocks (one script, one round trip)."""
        self._promote(keys=[self.block_key(namespace, h) for h in hashes])

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove a block's entry (after it failed verification or its blob vanished)."""
        self.reclaim([member_name(namespace, block_hash)], force=True)

    def members(self, batch: int = 1000, namespace: Namespace | None = None) -> Iterator[list[str]]:
        """Every member of every namespace's (or one's) LRU set, in batches (ZSCAN: safe while
        others write)."""
        for ns in [namespace.hex()] if namespace is not None else self._namespaces():
            found = (m.decode() for m, _ in self.client.zscan_iter(self.keys.of(ns, "lru"), count=batch))
            while chunk := list(itertools.islice(found, batch)):
                yield chunk

    def entries(self, members: Sequence[str]) -> list[IndexEntry | None]:
        """The entries of ``members`` (None: gone or unreadable); one round trip per node."""
        pipe = self.client.pipeline(transaction=False)
        for member in members:
            pipe.get(self.keys.member(member))
        out: list[IndexEntry | None] = []
        for raw in pipe.execute() if members else []:
            try:
                out.append(None if raw is None else IndexEntry.from_json(raw))
            except (ValueError, KeyError, TypeError):
                out.append(None)
        return out

    def known(self, members: Sequence[str]) -> list[bool]:
        """Whether each member is accounted (has a size record); one round trip per node."""
        pipe = self.client.pipeline(transaction=False)
        for m in members:
            pipe.hexists(self.keys.of(m.partition(":")[0], "sizes"), m)
        return [bool(x) for x in pipe.execute()] if members else []

    def total_bytes(self) -> int:
        """Bytes held over every namespace (the sum of their counters), pinned ones included."""
        return sum(self._per_namespace("get", "bytes").values())

    def num_blocks(self) -> int:
        """Blocks accounted over every namespace."""
        return sum(self._per_namespace("zcard", "lru").values())

    def retention_counts(self) -> list[int]:  # NOTE: store.index.retention, lowest class first
        return sorted_set_counts(self.client, [self.keys.of(ns, "lru") for ns in self._namespaces()])

    def ping(self) -> None:
        """Raises ``redis.RedisError`` when Redis does not answer."""
        self.client.ping()

    def shared_counters(self) -> SharedCounters:
        """The deployment-wide counters, in the same Redis under the same prefix."""
        return SharedCounters(self.client, self.key_prefix)

    def hot_prefixes(self) -> RedisHotPrefixes:
        """The hot prefixes, in the same Redis under the same prefix."""
        return self._hot
