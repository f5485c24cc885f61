"""The Redis index: metadata of every block, each entry with a TTL, plus LRU order and sizes.

Keys (all under ``key_prefix``, default ``kvp:``; a block's *member* name is its key without the
prefix, ``{namespace_hex}:b:{hash_hex}``):

    ``{prefix}{member}``  JSON ``{"blob", "bytes", "parent", "created"}``, with a TTL (seconds)
    ``{prefix}lru``       sorted set: member -> time of last use (seconds), the tail of a chain
                          scored a little older than its head so it is evicted first
    ``{prefix}sizes``     hash: member -> blob bytes, for every member of ``lru``
    ``{prefix}bytes``     the sum of ``sizes``: what the blob store holds
    ``{prefix}{ns}:s:{hash}``  "seen": a block was stored once (kept a week), to tell a miss on
                          a block never seen from one on a block that expired or was evicted
    ``{prefix}{ns}:c:{parent_hex or "root"}``  set of child hashes, to find where a prompt diverged
    (``store.counters`` keeps the deployment-wide counters under ``{prefix}stats`` and ``{prefix}tok:``)

Redis never holds tensors. Every change to these keys is one Lua script (``store.scripts``), so
several processes can share them: a lookup, a publish, an eviction and a reclaim are each atomic
and one round trip.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import redis

from hashing import BlockHash, Namespace
from store import scripts
from store.counters import SharedCounters
from store.entries import IndexEntry, member_name

SEEN_TTL_S = 7 * 86_400
"""Seconds a "seen" marker outlives its block: long enough to tell "expired" from "never seen"."""


class RedisIndex:
    """Block index in Redis (implements ``store.parts.BlockIndex``). Every method may raise
    ``redis.RedisError``; callers degrade."""

    def __init__(self, client: redis.Redis, key_prefix: str) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.lru_key = f"{key_prefix}lru"
        self.sizes_key = f"{key_prefix}sizes"
        self.bytes_key = f"{key_prefix}bytes"
        self._match = client.register_script(scripts.MATCH)
        self._publish = client.register_script(scripts.PUBLISH)
        self._evict = client.register_script(scripts.EVICT)
        self._reclaim = client.register_script(scripts.RECLAIM)

    def block_key(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return self.key_prefix + member_name(namespace, block_hash)

    def match(
        self, namespace: Namespace, hashes: Sequence[BlockHash], ttls: Sequence[int]
    ) -> tuple[list[IndexEntry], bool]:
        """Entries of the leading blocks present, stopping at the first missing one.

        One round trip; refreshes the TTL of matched key i to at least ``ttls[i]`` seconds and
        marks it used now. An entry that does not parse ends the match there.

        Returns:
            The entries, and whether the first missing block (if any) was stored once before
            (it expired or was evicted) rather than never seen.
        """
        if not hashes:
            return [], False
        keys = [self.block_key(namespace, h) for h in hashes]
        args: list[str | int | float] = [self.lru_key, len(self.key_prefix), time.time(), self.key_prefix]
        raws, seen = self._match(keys=keys, args=[*args, *ttls])
        entries: list[IndexEntry] = []
        for raw in raws:
            try:
                entries.append(IndexEntry.from_json(raw))
            except (ValueError, KeyError, TypeError):
                break
        return entries, bool(seen)

    def children(self, namespace: Namespace, parent: BlockHash | None) -> list[BlockHash]:
        """Hashes of blocks stored under ``parent`` (None: the first block of a chain) that
        still have an index entry."""
        members: set[bytes] = self.client.smembers(self._children_key(namespace, parent))  # type: ignore[assignment]
        hashes = [BlockHash(bytes.fromhex(m.decode())) for m in members]
        missing = self.missing(namespace, hashes) if hashes else []
        return [h for h, gone in zip(hashes, missing, strict=True) if not gone]

    def _children_key(self, namespace: Namespace, parent: BlockHash | None) -> str:
        return f"{self.key_prefix}{namespace.hex()}:c:{parent.hex() if parent is not None else 'root'}"

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        """For each hash, whether the index lacks it (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for h in hashes:
            pipe.exists(self.block_key(namespace, h))
        return [not found for found in pipe.execute()]

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
        """Index a block whose blob is complete: ``SET NX EX``, LRU position, size (nothing
        changes when another writer published the block first).

        Args:
            index: the block's position in its chain (deeper blocks are evicted first).
            used_at: Unix time (seconds) of the request that computed the block.

        Returns:
            The bytes the blob store holds now.
        """
        member = member_name(namespace, block_hash)
        args: list[str | int | float] = [
            entry.to_json(),
            ttl_s,
            self.lru_key,
            self.sizes_key,
            self.bytes_key,
            member,
            entry.size,
            index,
            used_at,
            f"{self.key_prefix}{namespace.hex()}:s:{block_hash.hex()}",
            self._children_key(namespace, parent),
            SEEN_TTL_S,
            block_hash.hex(),
        ]
        return int(self._publish(keys=[self.key_prefix + member], args=args))

    def evict(self, max_bytes: int) -> list[str]:
        """Remove least recently used blocks until the store holds at most ``max_bytes``.

        Returns:
            The evicted members; their blobs are the caller's to delete.
        """
        args: list[str | int] = [self.lru_key, self.sizes_key, self.bytes_key, self.key_prefix, max_bytes]
        return [m.decode() for m in self._evict(args=args)]

    def reclaim(self, members: Sequence[str], *, force: bool) -> list[str]:
        """Forget members: those whose entry expired (or all given, with ``force``).

        Returns:
            The members removed from the index; their blobs are the caller's to delete.
        """
        if not members:
            return []
        args = [
            self.lru_key,
            self.sizes_key,
            self.bytes_key,
            self.key_prefix,
            "1" if force else "0",
            *members,
        ]
        return [m.decode() for m in self._reclaim(args=args)]

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove a block's entry (after it failed verification or its blob vanished)."""
        self.reclaim([member_name(namespace, block_hash)], force=True)

    def members(self, batch: int = 1000) -> Iterator[list[str]]:
        """Every member in LRU order's set, in batches (ZSCAN: safe while others write)."""
        chunk: list[str] = []
        for member, _ in self.client.zscan_iter(self.lru_key, count=batch):
            chunk.append(member.decode())
            if len(chunk) >= batch:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def entries(self, members: Sequence[str]) -> list[IndexEntry | None]:
        """The entries of ``members`` (None where gone or unreadable); one round trip."""
        raws = self.client.mget([self.key_prefix + m for m in members]) if members else []
        out: list[IndexEntry | None] = []
        for raw in raws:
            try:
                out.append(None if raw is None else IndexEntry.from_json(raw))
            except (ValueError, KeyError, TypeError):
                out.append(None)
        return out

    def known(self, members: Sequence[str]) -> list[bool]:
        """Whether each member is accounted in the index (has a size record); one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for m in members:
            pipe.hexists(self.sizes_key, m)
        return [bool(x) for x in pipe.execute()]

    def total_bytes(self) -> int:
        return int(self.client.get(self.bytes_key) or 0)

    def num_blocks(self) -> int:
        return int(self.client.zcard(self.lru_key))

    def ping(self) -> None:
        """Raises ``redis.RedisError`` when Redis does not answer."""
        self.client.ping()

    def shared_counters(self) -> SharedCounters:
        """The deployment-wide counters, in the same Redis under the same prefix."""
        return SharedCounters(self.client, self.key_prefix)
