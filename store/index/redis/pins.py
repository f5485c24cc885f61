"""Pinned blocks in Redis (``store.index.pins``): the blocks of named caches, which the byte
budget never evicts (``store.index.retention.PINNED``).

A namespace's ``pins`` hash counts the named caches pinning each member; ``pinned`` sums the
``sizes`` of the members it lists (the pinned budget's bytes, which the LRU budget leaves out).
A pinned member keeps its place in the LRU set, scored ``PIN_OFFSET`` up (above every class the
budget evicts), and its entry's TTL is raised to the pin's. A block may be pinned before it is
stored: PUBLISH (``store.index.redis.scripts``) then scores and counts it as pinned, so the budget
never evicts a named cache's blocks while they are being stored. Unpinned, a block takes the
class of the TTL it has left. FORGET unpins a member it removes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import redis

from hashing import BlockHash, Namespace
from store.entries import member_name
from store.index.pins import Pinning
from store.index.redis.keys import IndexKeys
from store.index.redis.retention import RETENTION

# PIN: pin every block of a chain, those not stored yet included (PUBLISH pins them as they come).
#   KEYS[1] LRU   KEYS[2] sizes   KEYS[3] pins   KEYS[4] pinned bytes   KEYS[4 + i] block i's entry
#   ARGV[1] now (Unix seconds)   ARGV[2] TTL (seconds) the entries keep at least   ARGV[2 + i] member i
# Returns {bytes newly pinned, bytes of the blocks stored, blocks not stored}.
PIN = (
    RETENTION
    + """
local added, held, missing = 0, 0, 0
for i = 1, #KEYS - 4 do
  local member = ARGV[2 + i]
  local size = tonumber(redis.call('HGET', KEYS[2], member) or '0')
  local stored = redis.call('EXISTS', KEYS[4 + i]) == 1
  if stored then redis.call('EXPIRE', KEYS[4 + i], ARGV[2], 'GT') else missing = missing + 1 end
  if redis.call('HINCRBY', KEYS[3], member, 1) == 1 and size > 0 then
    redis.call('INCRBY', KEYS[4], size)  -- NOTE: as UNPIN and FORGET take it: every sized member
    added = added + size
  end
  if stored then
    held = held + size
    redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[1]) - i * 1e-6 + PIN, member)
  end
end
return {added, held, missing}
"""
)

# UNPIN: one named cache lets its blocks go; a block no other pins takes its TTL's class again.
#   KEYS as PIN's   ARGV[1] now   ARGV[1 + i] member i
UNPIN = (
    RETENTION
    + """
for i = 1, #KEYS - 4 do
  local member = ARGV[1 + i]
  if redis.call('HEXISTS', KEYS[3], member) == 1 and redis.call('HINCRBY', KEYS[3], member, -1) <= 0 then
    redis.call('HDEL', KEYS[3], member)
    redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[2], member) or '0'))
    local offset = lru_offset(math.max(0, redis.call('TTL', KEYS[4 + i])))
    redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[1]) - i * 1e-6 + offset, member)
  end
end
"""
)


class RedisPins:
    """Pin and unpin chains of blocks in a ``store.index.redis.index.RedisIndex``'s keys (each
    call one script on the namespace's node). Methods may raise ``redis.RedisError``."""

    def __init__(
        self, client: redis.Redis, keys: IndexKeys, per_namespace: Callable[[str, str], dict[str, int]]
    ) -> None:
        self.client, self.keys, self.per_namespace = client, keys, per_namespace
        self._pin = client.register_script(PIN)
        self._unpin = client.register_script(UNPIN)

    def _keys(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[str]:
        ns = namespace.hex()
        lru, sizes, _ = self.keys.accounts(ns)
        return [lru, sizes, *self.keys.pins(ns), *(self.keys.block(namespace, h) for h in hashes)]

    def pin(self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int) -> Pinning:
        """Pin the blocks ``hashes`` (``store.index.pins.Pins.pin``)."""
        members = [member_name(namespace, h) for h in hashes]
        found = self._pin(keys=self._keys(namespace, hashes), args=[time.time(), ttl_s, *members])
        return Pinning(*(int(x) for x in found))

    def unpin(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Release one pin of each block; those no named cache pins any more are evicted again."""
        members = [member_name(namespace, h) for h in hashes]
        self._unpin(keys=self._keys(namespace, hashes), args=[time.time(), *members])

    def pinned_bytes(self) -> int:
        """Bytes pinned over every namespace (each namespace's ``pinned``)."""
        return sum(self.per_namespace("get", "pinned").values())
