"""The index's Lua scripts. Each runs atomically in one round trip; the legend above each names
its KEYS and ARGV (``store.index.redis.index`` documents the keys themselves).

Every script declares every key it touches in KEYS, and all of one call's keys belong to one
namespace, so they share one Redis Cluster hash slot (``store.index.redis.index``): a script runs on one node.

NOTE: ``EXPIRE ... GT`` (Redis >= 7) refreshes a TTL but never shortens one, so a block stored
with a longer retention keeps it when a request with the default TTL hits it. LRU scores are the
time of the request (the caller's clock), a block deeper in the chain one microsecond "older", so
the blocks one request used or stored are evicted tail first.
"""

from __future__ import annotations

from collections.abc import Sequence

from hashing import Namespace
from store.entries import member_name
from store.index.base import Publication
from store.index.redis.keys import IndexKeys

# MATCH: walk a chain, stopping at the first missing entry; refresh TTL and LRU of each found.
#   KEYS[1]    the namespace's LRU sorted set
#   KEYS[1 + i]      block i's entry key (chain order, n blocks)
#   KEYS[1 + n + i]  block i's "seen" key
#   ARGV[1]    now (Unix seconds)     ARGV[2]  length of the entry keys' prefix before the member
#   ARGV[2 + i]  block i's TTL in seconds      ARGV[2 + n + i]  block i's member name
# Returns {entries found (JSON strings), 1 if the first missing block was stored once else 0}.
MATCH = """
local n = (#KEYS - 1) / 2
local now = tonumber(ARGV[1])
local entries = {}
local seen = 0
for i = 1, n do
  local entry = redis.call('GET', KEYS[1 + i])
  if not entry then
    seen = redis.call('EXISTS', KEYS[1 + n + i])
    break
  end
  redis.call('EXPIRE', KEYS[1 + i], ARGV[2 + i], 'GT')
  redis.call('ZADD', KEYS[1], 'XX', now - i * 1e-6, ARGV[2 + n + i])
  entries[i] = entry
end
return {entries, seen}
"""

# PUBLISH: index blocks whose blobs are complete (SET NX: the first writer of each block wins).
#   KEYS[1] LRU sorted set   KEYS[2] sizes hash   KEYS[3] bytes
#   KEYS[3 + 3(i-1) + 1..3]  block i's entry key, its "seen" key, its parent's children set
#   ARGV[1] "seen" TTL (s)
#   ARGV[1 + 7(i-1) + 1..7]  block i's entry JSON, TTL (s), member name, blob bytes, block index,
#                            used at (Unix seconds), block hash (hex)
# Returns the bytes the namespace holds now (a block whose entry existed writes nothing).
PUBLISH = """
local n = (#KEYS - 3) / 3
for i = 1, n do
  local k, a = 3 + 3 * (i - 1), 1 + 7 * (i - 1)
  if redis.call('SET', KEYS[k + 1], ARGV[a + 1], 'NX', 'EX', ARGV[a + 2]) then
    redis.call('ZADD', KEYS[1], tonumber(ARGV[a + 6]) - tonumber(ARGV[a + 5]) * 1e-6, ARGV[a + 3])
    redis.call('SET', KEYS[k + 2], '1', 'EX', ARGV[1])
    redis.call('SADD', KEYS[k + 3], ARGV[a + 7])
    redis.call('EXPIRE', KEYS[k + 3], ARGV[a + 2], 'GT')
    redis.call('EXPIRE', KEYS[k + 3], ARGV[a + 2], 'NX')
    if redis.call('HSETNX', KEYS[2], ARGV[a + 3], ARGV[a + 4]) == 1 then
      redis.call('INCRBY', KEYS[3], ARGV[a + 4])
    end
  end
end
return tonumber(redis.call('GET', KEYS[3]) or '0')
"""


def publish_arguments(
    keys: IndexKeys, namespace: Namespace, blocks: Sequence[Publication], seen_ttl_s: int
) -> tuple[list[str], list[str | int | float]]:
    """``(KEYS, ARGV)`` of one PUBLISH call for ``blocks``, as its legend lays them out."""
    ns = namespace.hex()
    out_keys = keys.accounts(ns)
    args: list[str | int | float] = [seen_ttl_s]
    for b in blocks:
        out_keys += [keys.block(namespace, b.block_hash), keys.seen(namespace, b.block_hash)]
        out_keys.append(keys.children(namespace, b.parent))
        member, entry = member_name(namespace, b.block_hash), b.entry
        args += [entry.to_json(), b.ttl_s, member, entry.size, b.position, b.used_at, b.block_hash.hex()]
    return out_keys, args


# PROMOTE: clear the "imported" mark of blocks their audit confirmed (each TTL kept).
#   KEYS[i] block i's entry key
PROMOTE = """
for i = 1, #KEYS do
  local entry = redis.call('GET', KEYS[i])
  if entry then
    local doc = cjson.decode(entry)
    doc['imported'] = nil
    redis.call('SET', KEYS[i], cjson.encode(doc), 'KEEPTTL')
  end
end
"""

# FORGET: remove members from one namespace's index: those given as evicted (still at the LRU
# score the caller read: not used since), or whose entry is gone (reclaim), or all (force).
#   KEYS[1] LRU sorted set   KEYS[2] sizes hash   KEYS[3] bytes   KEYS[3 + i] member i's entry key
#   ARGV[1] mode: 'evict', 'reclaim' or 'force'   ARGV[2] bytes to free at most (evict; else 0)
#   ARGV[2 + 2i - 1] member i's name   ARGV[2 + 2i] its LRU score as read (evict; else ignored)
# Returns the members removed (their blobs are the caller's to delete).
FORGET = """
local mode = ARGV[1]
local budget = tonumber(ARGV[2])
local freed = 0
local removed = {}
for i = 1, #KEYS - 3 do
  local member = ARGV[1 + 2 * i]
  local take
  if mode == 'force' then
    take = true
  elseif mode == 'reclaim' then
    take = redis.call('EXISTS', KEYS[3 + i]) == 0
  else
    if freed >= budget then break end
    local score = redis.call('ZSCORE', KEYS[1], member)
    take = score ~= false and tonumber(score) <= tonumber(ARGV[2 + 2 * i])
  end
  if take then
    redis.call('DEL', KEYS[3 + i])
    redis.call('ZREM', KEYS[1], member)
    local size = redis.call('HGET', KEYS[2], member)
    if size then
      redis.call('HDEL', KEYS[2], member)
      redis.call('DECRBY', KEYS[3], size)
      freed = freed + tonumber(size)
    end
    removed[#removed + 1] = member
  end
end
return removed
"""
