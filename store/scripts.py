"""The index's Lua scripts. Each runs atomically in one round trip; the legend above each names
its KEYS and ARGV (``store.index`` documents the keys themselves).

NOTE: ``EXPIRE ... GT`` (Redis >= 7) refreshes a TTL but never shortens one, so a block stored
with a longer retention keeps it when a request with the default TTL hits it. LRU scores are the
time of the request (the caller's clock), a block deeper in the chain one microsecond "older", so
the blocks one request used or stored are evicted tail first.
"""

# MATCH: walk a chain, stopping at the first missing entry; refresh TTL and LRU of each found.
#   KEYS[i]    the entry key of block i (in chain order)
#   ARGV[1]    LRU sorted-set key     ARGV[2]  length of the key prefix   ARGV[3]  now (Unix seconds)
#   ARGV[4]    the key prefix         ARGV[4 + i]  block i's TTL in seconds
# Returns {entries found (JSON strings), 1 if the first missing block was stored once else 0}.
MATCH = """
local now = tonumber(ARGV[3])
local plen = tonumber(ARGV[2])
local entries = {}
local seen = 0
for i, key in ipairs(KEYS) do
  local entry = redis.call('GET', key)
  if not entry then
    local member = string.sub(key, plen + 1)
    local ns, hash = string.match(member, '^(%x+):b:(%x+)$')
    seen = redis.call('EXISTS', ARGV[4] .. ns .. ':s:' .. hash)
    break
  end
  redis.call('EXPIRE', key, ARGV[4 + i], 'GT')
  redis.call('ZADD', ARGV[1], 'XX', now - i * 1e-6, string.sub(key, plen + 1))
  entries[i] = entry
end
return {entries, seen}
"""

# PUBLISH: index one block whose blob is complete (SET NX: the first writer wins).
#   KEYS[1]   the block's entry key
#   ARGV[1]   entry JSON           ARGV[2]  TTL in seconds       ARGV[3]  LRU sorted-set key
#   ARGV[4]   sizes hash key       ARGV[5]  total bytes key      ARGV[6]  member name
#   ARGV[7]   blob bytes           ARGV[8]  block index          ARGV[9]  used at (Unix seconds)
#   ARGV[10]  "seen" key           ARGV[11] parent's children set key
#   ARGV[12]  "seen" TTL (s)       ARGV[13] the block hash (hex)
# Returns the bytes the store holds now (unchanged when the entry existed: nothing is written).
PUBLISH = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return tonumber(redis.call('GET', ARGV[5]) or '0')
end
redis.call('ZADD', ARGV[3], tonumber(ARGV[9]) - tonumber(ARGV[8]) * 1e-6, ARGV[6])
redis.call('SET', ARGV[10], '1', 'EX', ARGV[12])
redis.call('SADD', ARGV[11], ARGV[13])
redis.call('EXPIRE', ARGV[11], ARGV[2], 'GT')
redis.call('EXPIRE', ARGV[11], ARGV[2], 'NX')
if redis.call('HSETNX', ARGV[4], ARGV[6], ARGV[7]) == 1 then
  return redis.call('INCRBY', ARGV[5], ARGV[7])
end
return tonumber(redis.call('GET', ARGV[5]) or '0')
"""

# EVICT: pop least recently used members until the total is within the budget.
#   ARGV[1]  LRU sorted-set key    ARGV[2]  sizes hash key       ARGV[3]  total bytes key
#   ARGV[4]  the key prefix        ARGV[5]  budget in bytes
# Returns the evicted members (their blobs are the caller's to delete).
EVICT = """
local evicted = {}
local total = tonumber(redis.call('GET', ARGV[3]) or '0')
while total > tonumber(ARGV[5]) do
  local popped = redis.call('ZPOPMIN', ARGV[1])
  if #popped == 0 then break end
  local member = popped[1]
  local size = tonumber(redis.call('HGET', ARGV[2], member) or '0')
  redis.call('HDEL', ARGV[2], member)
  redis.call('DEL', ARGV[4] .. member)
  total = redis.call('DECRBY', ARGV[3], size)
  evicted[#evicted + 1] = member
end
return evicted
"""

# RECLAIM: forget members whose entry is gone (or all given, when forced).
#   ARGV[1]  LRU sorted-set key    ARGV[2]  sizes hash key       ARGV[3]  total bytes key
#   ARGV[4]  the key prefix        ARGV[5]  '1': force           ARGV[6..] members
# Returns the members removed (their blobs are the caller's to delete).
RECLAIM = """
local reclaimed = {}
for i = 6, #ARGV do
  local member = ARGV[i]
  if ARGV[5] == '1' or redis.call('EXISTS', ARGV[4] .. member) == 0 then
    redis.call('DEL', ARGV[4] .. member)
    redis.call('ZREM', ARGV[1], member)
    local size = redis.call('HGET', ARGV[2], member)
    if size then
      redis.call('HDEL', ARGV[2], member)
      redis.call('DECRBY', ARGV[3], size)
    end
    reclaimed[#reclaimed + 1] = member
  end
end
return reclaimed
"""
