"""The Redis index: one key per block, holding metadata only, each with a TTL.

Keys (all under ``key_prefix``, default ``kvp:``):
    ``{prefix}{namespace_hex}:b:{hash_hex}`` -> JSON ``{"blob", "bytes", "parent", "created"}``
    with a TTL in seconds. Redis never holds tensors.

A chain lookup is one round trip: a Lua script walks the keys in chain order, stops at the first
missing one, and refreshes the TTL of every key it matched (sliding TTL).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from hashing import BlockHash, Namespace

# NOTE: EXPIRE ... GT (Redis >= 7) refreshes a TTL but never shortens one, so a block stored with
# a longer retention keeps it when a request with the default TTL hits it.
_MATCH_SCRIPT = """
local entries = {}
for i, key in ipairs(KEYS) do
  local entry = redis.call('GET', key)
  if not entry then break end
  redis.call('EXPIRE', key, ARGV[1], 'GT')
  entries[i] = entry
end
return entries
"""


@dataclass(frozen=True)
class IndexEntry:
    """What the index knows of one block.

    Attributes:
        blob: blob path relative to the blob store root.
        size: size of the blob file in bytes (``"bytes"`` in the JSON).
        parent: hex hash of the previous block in the chain, or ``""`` for block 0.
        created: Unix time (seconds) the entry was published.
    """

    blob: str
    size: int
    parent: str
    created: float

    def to_json(self) -> str:
        return json.dumps(
            {"blob": self.blob, "bytes": self.size, "parent": self.parent, "created": self.created}
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> IndexEntry:
        doc = json.loads(raw)
        return cls(str(doc["blob"]), int(doc["bytes"]), str(doc["parent"]), float(doc["created"]))


class RedisIndex:
    """Block index in Redis. Every method may raise ``redis.RedisError``; callers degrade."""

    def __init__(self, client: redis.Redis, key_prefix: str) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self._match = client.register_script(_MATCH_SCRIPT)

    def block_key(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return f"{self.key_prefix}{namespace.hex()}:b:{block_hash.hex()}"

    def match(self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int) -> list[IndexEntry]:
        """Entries of the leading blocks present, stopping at the first missing one.

        One round trip; refreshes the TTL of each matched key to at least ``ttl_s`` seconds.
        An entry that does not parse ends the match there.
        """
        if not hashes:
            return []
        keys = [self.block_key(namespace, h) for h in hashes]
        entries: list[IndexEntry] = []
        for raw in self._match(keys=keys, args=[ttl_s]):
            try:
                entries.append(IndexEntry.from_json(raw))
            except (ValueError, KeyError, TypeError):
                break
        return entries

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        """For each hash, whether the index lacks it (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for h in hashes:
            pipe.exists(self.block_key(namespace, h))
        return [not found for found in pipe.execute()]

    def publish(self, namespace: Namespace, block_hash: BlockHash, entry: IndexEntry, ttl_s: int) -> bool:
        """Index a block whose blob is complete on disk (``SET NX EX``).

        Returns:
            False when another writer published the block first (nothing changes).
        """
        return bool(
            self.client.set(self.block_key(namespace, block_hash), entry.to_json(), nx=True, ex=ttl_s)
        )

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove a block's entry (after it failed verification or its blob vanished)."""
        self.client.delete(self.block_key(namespace, block_hash))

    def ping(self) -> None:
        """Raises ``redis.RedisError`` when Redis does not answer."""
        self.client.ping()


def new_entry(blob: str, size: int, parent: BlockHash | None) -> IndexEntry:
    """An entry for a blob just written, created now."""
    return IndexEntry(blob, size, parent.hex() if parent is not None else "", time.time())
