"""Hot prefixes in Redis: per namespace, the cached prefixes that saved the most prompt tokens.

Every counted lookup that hits records its deepest matched block on the writer's thread (never on
the request's path): one hit and the tokens it saved. Keys (``store.index.redis.keys``), hash-tagged like the
namespace's blocks so one script touches one Redis Cluster slot:

    ``{prefix}{{ns}}:hot``       sorted set: deepest block hash (hex) -> tokens saved (all hits),
                                 at most ``HOT_KEEP`` members (the least valuable go first)
    ``{prefix}{{ns}}:hot:hits``  hash: deepest block hash -> hits
    ``{prefix}{{ns}}:hot:root``  hash: deepest block hash -> ``"{block 0 hash}:{blocks}"``

The three keys expire ``HOT_KEEP_S`` after the namespace's last hit. ``top`` skips, and removes,
prefixes whose deepest block's index entry has expired (or was evicted).
"""

from __future__ import annotations

from typing import NamedTuple

import redis

from hashing import BlockHash, Namespace
from store.entries import IndexEntry
from store.index.base import HOT_KEEP, HotPrefix
from store.index.redis.keys import IndexKeys

HOT_KEEP_S = 7 * 86_400
"""Seconds the hot keys of a namespace outlive its last hit."""

# RECORD: one hit of a prefix.
#   KEYS[1] the sorted set   KEYS[2] the hits hash   KEYS[3] the roots hash
#   ARGV[1] deepest block hash (hex)   ARGV[2] tokens saved   ARGV[3] "{block 0 hash}:{blocks}"
#   ARGV[4] HOT_KEEP   ARGV[5] HOT_KEEP_S
RECORD = """
redis.call('ZINCRBY', KEYS[1], ARGV[2], ARGV[1])
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
if extra > 0 then
  local gone = redis.call('ZRANGE', KEYS[1], 0, extra - 1)
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('HDEL', KEYS[3], unpack(gone))
end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
"""


class RedisHotPrefixes:
    """``HotPrefixes`` in Redis (the layout of the module docstring)."""

    def __init__(self, client: redis.Redis, keys: IndexKeys) -> None:
        self.client, self.keys = client, keys
        self._record = client.register_script(RECORD)

    def _keys(self, ns: str) -> list[str]:
        return [self.keys.of(ns, "hot"), self.keys.of(ns, "hot:hits"), self.keys.of(ns, "hot:root")]

    def record(
        self, namespace: Namespace, root: BlockHash, deepest: BlockHash, blocks: int, tokens: int
    ) -> None:
        args: list[str | int] = [deepest.hex(), tokens, f"{root.hex()}:{blocks}", HOT_KEEP, HOT_KEEP_S]
        self._record(keys=self._keys(namespace.hex()), args=args)

    def namespaces(self) -> list[str]:
        return sorted(m.decode() for m in self.client.smembers(self.keys.namespaces))  # type: ignore[union-attr]

    def top(self, namespace: Namespace | None, n: int) -> list[HotPrefix]:
        tallies = self._tallies([namespace.hex()] if namespace is not None else self.namespaces())
        # NOTE: one round trip for the TTL and entry of every member: at most HOT_KEEP per namespace.
        pipe = self.client.pipeline(transaction=False)
        for t in tallies:
            pipe.ttl(self.keys.of(t.ns, f"b:{t.deepest}"))
            pipe.get(self.keys.of(t.ns, f"b:{t.deepest}"))
        replies = pipe.execute() if tallies else []
        alive: list[HotPrefix] = []
        pipe = self.client.pipeline(transaction=False)
        for t, ttl, raw in zip(tallies, replies[::2], replies[1::2], strict=True):
            prefix = _prefix(t, ttl, raw)
            if prefix is not None:
                alive.append(prefix)
                continue
            sorted_set, hits, roots = self._keys(t.ns)
            pipe.zrem(sorted_set, t.deepest)
            pipe.hdel(hits, t.deepest)
            pipe.hdel(roots, t.deepest)
        if len(alive) < len(tallies):
            pipe.execute()
        return sorted(alive, key=lambda p: -p.tokens_saved)[:n]

    def _tallies(self, spaces: list[str]) -> list[_RedisTally]:
        """Every recorded prefix of ``spaces`` (one round trip per node)."""
        pipe = self.client.pipeline(transaction=False)
        for ns in spaces:
            sorted_set, hits, roots = self._keys(ns)
            pipe.zrange(sorted_set, 0, -1, withscores=True)
            pipe.hgetall(hits)
            pipe.hgetall(roots)
        found = pipe.execute() if spaces else []
        tallies: list[_RedisTally] = []
        for i, ns in enumerate(spaces):
            scored, hits, roots = found[3 * i : 3 * i + 3]
            for member, score in scored:
                root = roots.get(member, b"").decode()
                tallies.append(_RedisTally(ns, member.decode(), int(score), int(hits.get(member, 0)), root))
        return tallies


class _RedisTally(NamedTuple):
    ns: str
    deepest: str  # hex
    tokens_saved: int
    hits: int
    root: str  # "{block 0 hash}:{blocks}"


def _prefix(t: _RedisTally, ttl: int, raw: bytes | None) -> HotPrefix | None:
    """A listed prefix, or None when its last block's entry is gone (or a field is unreadable)."""
    try:
        entry = IndexEntry.from_json(raw) if raw is not None else None
        root_hex, _, blocks = t.root.partition(":")
        root = BlockHash(bytes.fromhex(root_hex))
        namespace = Namespace(bytes.fromhex(t.ns))
        size = int(blocks)
    except (ValueError, KeyError, TypeError):
        return None
    if entry is None or ttl == -2:
        return None
    return HotPrefix(namespace, root, size, t.hits, t.tokens_saved, None if ttl < 0 else ttl, entry.size)
