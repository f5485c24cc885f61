"""The Lua scripts of the stored responses on Redis (``proxy.responses.state``): one script stores
a response and keeps both budgets (the tenant's share, then the whole), one deletes a response.
Every key they touch has the ``{responses}`` hash tag: on a Redis Cluster they run on one node."""

DROP = """
local base = ARGV[1]
local function drop(m)
  local size = tonumber(redis.call('HGET', KEYS[1], m) or '0')
  local own = base .. 't:' .. string.match(m, '^[^:]*') .. ':'
  redis.call('HDEL', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('ZREM', own .. 'order', m)
  redis.call('DEL', base .. 'r:' .. m)
  redis.call('DECRBY', KEYS[3], size)
  if redis.call('DECRBY', own .. 'bytes', size) <= 0 then redis.call('DEL', own .. 'bytes') end
end
"""
# DROP: forget member m and its accounting, the global and its tenant's (the digest before the
#   first ':' of m).  KEYS[1..3]: sizes, order, bytes.  ARGV[1]: the store's key prefix.

PUT = (
    DROP
    + """
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[7], 'LIMIT', 0, 64)) do drop(m) end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then drop(ARGV[2]) end
local own, size = base .. 't:' .. string.match(ARGV[2], '^[^:]*') .. ':', #ARGV[3]
redis.call('SET', base .. 'r:' .. ARGV[2], ARGV[3], 'EX', ARGV[4])
redis.call('SET', base .. 's:' .. ARGV[2], '1', 'EX', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[2])
redis.call('ZADD', own .. 'order', ARGV[6], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[2], size)
redis.call('INCRBY', KEYS[3], size)
redis.call('INCRBY', own .. 'bytes', size)
local evicted = 0
for _, limit in ipairs({{own .. 'order', own .. 'bytes', ARGV[9]}, {KEYS[2], KEYS[3], ARGV[8]}}) do
  while tonumber(redis.call('GET', limit[2]) or '0') > tonumber(limit[3]) do
    local oldest = redis.call('ZRANGE', limit[1], 0, 0)[1]
    if oldest == nil or oldest == ARGV[2] then break end
    drop(oldest)
    evicted = evicted + 1
  end
end
return evicted
"""
)
# PUT: store one response, drop expired ones' accounting, evict the tenant's oldest while it is
#   over its share, then the oldest of all while over the budget.
#   KEYS: sizes, order, bytes.  ARGV: key prefix, member, JSON, TTL (s), seen TTL (s), expires
#   at, now, budget (bytes), the tenant's share (bytes).  Returns how many were evicted.

DELETE = (
    DROP
    + """
local existed = redis.call('DEL', base .. 'r:' .. ARGV[2])
redis.call('DEL', base .. 's:' .. ARGV[2])
drop(ARGV[2])
return existed
"""
)
# DELETE: remove one response and its accounting. KEYS as PUT's; ARGV: key prefix, member.
#   Returns 1 if it was there.
