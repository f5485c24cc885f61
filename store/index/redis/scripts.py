"""The index's Lua scripts. Each runs atomically in one round trip; the legend above each names
its KEYS and ARGV (``store.index.redis.index`` documents the keys themselves).

Every script declares every key it touches in KEYS, and all of one call's keys belong to one
namespace, so they share one Redis Cluster hash slot (``store.index.redis.index``): a script runs on one node.

NOTE: ``EXPIRE ... GT`` (Redis >= 7) refreshes a TTL but never shortens one, so a block stored
with a longer retention keeps it when a request with the default TTL hits it. LRU scores are the
time of the request (the caller's clock), a block deeper in the chain one microsecond "older", so
the blocks one request used or stored are evicted tail first; a tail (``hashing.tails``) is scored
``TAIL_AGE_S`` older still, so every tail goes before any block.
"""

from __future__ import annotations

from collections.abc import Sequence

from hashing import BlockHash, Namespace
from store.entries import member_name
from store.index.base import TAIL_AGE_S, TAILS_PER_TIP, Publication
from store.index.redis.keys import IndexKeys
from store.index.redis.retention import RETENTION

# Tails (``hashing.tails``) are listed in one hash per namespace, the "tails" key: field = the
# tip's hex hash (``root`` for the namespace root) -> JSON list of [tail hex, length, short hex
# or "", expires at (Unix seconds), its token ids (``tail_ids_text``)], at most TAILS_PER_TIP,
# the ones expiring last (an item listed before the ids were has four fields). An item's
# expiry follows its entry's TTL (set and refreshed with it); FORGET removes the item with the
# entry, so a lookup never lists a tail the index dropped.
LIVE_TAILS = """
local function live_tails(key, field, now, drop)
  local raw = redis.call('HGET', key, field)
  if not raw then return {} end
  local kept = {}
  for _, item in ipairs(cjson.decode(raw)) do
    if tonumber(item[4]) > now and item[1] ~= drop then kept[#kept + 1] = item end
  end
  if #kept == 0 then
    redis.call('HDEL', key, field)
  else
    redis.call('HSET', key, field, cjson.encode(kept))
  end
  return kept
end
"""

# MATCH: walk a chain, stopping at the first missing entry; refresh TTL and LRU of each found;
# list the live tails after the last one found; when every block was found, also the longest of
# the candidate tails after the last one (those that continue the prompt) that has an entry.
#   KEYS[1]    the namespace's LRU sorted set     KEYS[2]  its tails hash
#   KEYS[2 + i]      block i's entry key (chain order, n blocks)
#   KEYS[2 + n + i]  block i's "seen" key
#   KEYS[2 + 2n + j] the entry key of the candidate tail of j tokens after block n (m of them)
#   KEYS[#KEYS]      the namespace's pins hash (a pinned block keeps its class)
#   ARGV[1]    now (Unix seconds)     ARGV[2]  n
#   ARGV[2 + i]  block i's TTL in seconds      ARGV[2 + n + i]  block i's member name
#   ARGV[2 + 2n + 1 + k]  the tails field after k blocks (k = 0 .. n)
# Returns {entries found (JSON strings), 1 if the first missing block was stored once else 0,
# the live tails after them (JSON list), the length of the candidate found (0: none)}.
MATCH = (
    LIVE_TAILS
    + RETENTION
    + """
local n = tonumber(ARGV[2])
local m = #KEYS - 3 - 2 * n
local now = tonumber(ARGV[1])
local entries = {}
local seen = 0
for i = 1, n do
  local entry = redis.call('GET', KEYS[2 + i])
  if not entry then
    seen = redis.call('EXISTS', KEYS[2 + n + i])
    break
  end
  redis.call('EXPIRE', KEYS[2 + i], ARGV[2 + i], 'GT')
  local pinned = redis.call('HEXISTS', KEYS[#KEYS], ARGV[2 + n + i]) == 1
  local offset = pinned and PIN or lru_offset(redis.call('TTL', KEYS[2 + i]))
  redis.call('ZADD', KEYS[1], 'XX', now - i * 1e-6 + offset, ARGV[2 + n + i])
  entries[i] = entry
end
local tails = live_tails(KEYS[2], ARGV[3 + 2 * n + #entries], now, nil)
local candidate = 0
if #entries == n then
  for j = m, 1, -1 do
    if redis.call('EXISTS', KEYS[2 + 2 * n + j]) == 1 then
      candidate = j
      break
    end
  end
end
return {entries, seen, cjson.encode(tails), candidate}
"""
)


def match_arguments(
    keys: IndexKeys,
    namespace: Namespace,
    hashes: Sequence[BlockHash],
    ttls: Sequence[int],
    candidates: Sequence[BlockHash],
    now: float,
) -> tuple[list[str], list[str | int | float]]:
    """``(KEYS, ARGV)`` of one MATCH call for the chain ``hashes`` and the candidate tails after
    it (``candidates[j - 1]`` of j tokens), as its legend lays them out."""
    ns = namespace.hex()
    out_keys = [keys.of(ns, "lru"), keys.of(ns, "tails")]
    out_keys += [keys.block(namespace, h) for h in hashes] + [keys.seen(namespace, h) for h in hashes]
    out_keys += [keys.block(namespace, h) for h in candidates] + [keys.of(ns, "pins")]
    fields = [tails_field(None), *(tails_field(h) for h in hashes)]
    return out_keys, [now, len(hashes), *ttls, *(member_name(namespace, h) for h in hashes), *fields]


# PUBLISH: index blocks and tails whose blobs are complete (SET NX: the first writer of each wins).
#   KEYS[1] LRU sorted set   KEYS[2] sizes hash   KEYS[3] bytes   KEYS[4] tails hash
#   KEYS[4 + 3(i-1) + 1..3]  item i's entry key, its "seen" key, its parent's children set
#   KEYS[#KEYS - 1..#KEYS]   pins hash, pinned bytes (a block pinned before it was stored)
#   ARGV[1] "seen" TTL (s)   ARGV[2] TAILS_PER_TIP   ARGV[3] TAIL_AGE_S (a tail's LRU setback)
#   ARGV[3 + 11(i-1) + 1..11]  item i's entry JSON, TTL (s), member name, blob bytes, chain
#                            position, used at (Unix seconds), hash (hex), tail length (0: a
#                            block), short tail hash (hex or ""), tails field (its tip), a
#                            tail's token ids (``tail_ids_text``; "" for a block)
# Returns the bytes the namespace holds now (an item whose entry existed writes nothing).
PUBLISH = (
    LIVE_TAILS
    + RETENTION
    + """
local n = (#KEYS - 6) / 3
for i = 1, n do
  local k, a = 4 + 3 * (i - 1), 3 + 11 * (i - 1)
  if redis.call('SET', KEYS[k + 1], ARGV[a + 1], 'NX', 'EX', ARGV[a + 2]) then
    local used = tonumber(ARGV[a + 6])
    local is_tail = tonumber(ARGV[a + 8]) > 0
    local age = is_tail and tonumber(ARGV[3]) or 0
    local pinned = redis.call('HEXISTS', KEYS[#KEYS - 1], ARGV[a + 3]) == 1
    local offset = pinned and PIN or lru_offset(tonumber(ARGV[a + 2]))
    redis.call('ZADD', KEYS[1], used - age - tonumber(ARGV[a + 5]) * 1e-6 + offset, ARGV[a + 3])
    if is_tail then
      local tails = live_tails(KEYS[4], ARGV[a + 10], used, ARGV[a + 7])
      local expires = used + tonumber(ARGV[a + 2])
      tails[#tails + 1] = {ARGV[a + 7], tonumber(ARGV[a + 8]), ARGV[a + 9], expires, ARGV[a + 11]}
      table.sort(tails, function(x, y) return tonumber(x[4]) > tonumber(y[4]) end)
      while #tails > tonumber(ARGV[2]) do table.remove(tails) end
      redis.call('HSET', KEYS[4], ARGV[a + 10], cjson.encode(tails))
    else
      redis.call('SET', KEYS[k + 2], '1', 'EX', ARGV[1])
      redis.call('SADD', KEYS[k + 3], ARGV[a + 7])
      redis.call('EXPIRE', KEYS[k + 3], ARGV[a + 2], 'GT')
      redis.call('EXPIRE', KEYS[k + 3], ARGV[a + 2], 'NX')
    end
    if redis.call('HSETNX', KEYS[2], ARGV[a + 3], ARGV[a + 4]) == 1 then
      redis.call('INCRBY', KEYS[3], ARGV[a + 4])
      if pinned then redis.call('INCRBY', KEYS[#KEYS], ARGV[a + 4]) end
    end
  end
end
return tonumber(redis.call('GET', KEYS[3]) or '0')
"""
)


def tails_field(tip: BlockHash | None) -> str:
    """The field of the tails hash listing the tails after ``tip`` (None: the root)."""
    return tip.hex() if tip is not None else "root"


def tail_ids_text(token_ids: Sequence[int]) -> str:
    """A tail's token ids as its listing holds them: decimal, comma-separated ("" for none)."""
    return ",".join(str(t) for t in token_ids)


def publish_arguments(
    keys: IndexKeys, namespace: Namespace, blocks: Sequence[Publication], seen_ttl_s: int
) -> tuple[list[str], list[str | int | float]]:
    """``(KEYS, ARGV)`` of one PUBLISH call for ``blocks``, as its legend lays them out."""
    ns = namespace.hex()
    out_keys = [*keys.accounts(ns), keys.of(ns, "tails")]
    args: list[str | int | float] = [seen_ttl_s, TAILS_PER_TIP, TAIL_AGE_S]
    for b in blocks:
        out_keys += [keys.block(namespace, b.block_hash), keys.seen(namespace, b.block_hash)]
        out_keys.append(keys.children(namespace, b.parent))
        member, entry = member_name(namespace, b.block_hash), b.entry
        args += [entry.to_json(), b.ttl_s, member, entry.size, b.position, b.used_at, b.block_hash.hex()]
        args += [entry.tail, b.short_hash.hex() if b.short_hash else "", tails_field(b.parent)]
        args.append(tail_ids_text(b.token_ids))
    return [*out_keys, *keys.pins(ns)], args


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
#   KEYS[1] LRU sorted set   KEYS[2] sizes hash   KEYS[3] bytes   KEYS[4] tails hash
#   KEYS[4 + i] member i's entry key   KEYS[#KEYS - 1..#KEYS] pins hash, pinned bytes
#   ARGV[1] mode: 'evict', 'reclaim' or 'force'   ARGV[2] bytes to free at most (evict; else 0)
#   ARGV[2 + 2i - 1] member i's name   ARGV[2 + 2i] its LRU score as read (evict; else ignored)
# Returns the members removed (their blobs are the caller's to delete); a tail's listing goes
# with its entry (one whose entry expired is past its listed expiry already).
FORGET = (
    LIVE_TAILS
    + """
local mode = ARGV[1]
local budget = tonumber(ARGV[2])
local freed = 0
local removed = {}
local now = tonumber(redis.call('TIME')[1])
for i = 1, #KEYS - 6 do
  local member = ARGV[1 + 2 * i]
  local take
  if mode == 'force' then
    take = true
  elseif mode == 'reclaim' then
    take = redis.call('EXISTS', KEYS[4 + i]) == 0
  else
    if freed >= budget then break end
    local score = redis.call('ZSCORE', KEYS[1], member)
    take = score ~= false and tonumber(score) <= tonumber(ARGV[2 + 2 * i])
  end
  if take then
    local entry = redis.call('GET', KEYS[4 + i])
    if entry then
      local doc = cjson.decode(entry)
      if doc['tail'] then
        local tip = doc['parent'] == '' and 'root' or doc['parent']
        live_tails(KEYS[4], tip, now, string.sub(member, -32))
      end
    end
    redis.call('DEL', KEYS[4 + i])
    redis.call('ZREM', KEYS[1], member)
    local size = redis.call('HGET', KEYS[2], member)
    if size then
      redis.call('HDEL', KEYS[2], member)
      redis.call('DECRBY', KEYS[3], size)
      freed = freed + tonumber(size)
      if redis.call('HDEL', KEYS[#KEYS - 1], member) == 1 then redis.call('DECRBY', KEYS[#KEYS], size) end
    end
    removed[#removed + 1] = member
  end
end
return removed
"""
)
