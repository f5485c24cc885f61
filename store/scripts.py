"""The index's Lua scripts. Each runs atomically in one round trip; the legend above each names
its KEYS and ARGV (``store.index`` documents the keys themselves).

Every script declares every key it touches in KEYS, and all of one call's keys belong to one
namespace, so they share one Redis Cluster hash slot (``store.index``): a script runs on one node.

NOTE: ``EXPIRE ... GT`` (Redis >= 7) refreshes a TTL but never shortens one, so a block stored
with a longer retention keeps it when a request with the default TTL hits it. LRU scores are the
time of the request (the caller's clock), a block deeper in the chain one microsecond "older", so
the blocks one request used or stored are evicted tail first.
"""

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

# PUBLISH: index one block whose blob is complete (SET NX: the first writer wins).
#   KEYS[1] the block's entry key   KEYS[2] LRU sorted set   KEYS[3] sizes hash   KEYS[4] bytes
#   KEYS[5] the block's "seen" key  KEYS[6] its parent's children set
#   ARGV[1] entry JSON    ARGV[2] TTL (s)       ARGV[3] member name   ARGV[4] blob bytes
#   ARGV[5] block index   ARGV[6] used at (Unix seconds)   ARGV[7] "seen" TTL (s)
#   ARGV[8] the block hash (hex)
# Returns the bytes the namespace holds now (unchanged when the entry existed: nothing is written).
PUBLISH = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return tonumber(redis.call('GET', KEYS[4]) or '0')
end
redis.call('ZADD', KEYS[2], tonumber(ARGV[6]) - tonumber(ARGV[5]) * 1e-6, ARGV[3])
redis.call('SET', KEYS[5], '1', 'EX', ARGV[7])
redis.call('SADD', KEYS[6], ARGV[8])
redis.call('EXPIRE', KEYS[6], ARGV[2], 'GT')
redis.call('EXPIRE', KEYS[6], ARGV[2], 'NX')
if redis.call('HSETNX', KEYS[3], ARGV[3], ARGV[4]) == 1 then
  return redis.call('INCRBY', KEYS[4], ARGV[4])
end
return tonumber(redis.call('GET', KEYS[4]) or '0')
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
