"""What the named caches' pinned bytes are charged against ``--max-pinned-bytes`` and each
tenant's share of it: the bytes of the recorded caches, and *reservations* of the ones being made.

A create reserves its estimated bytes before any work (``RESERVE``), checked against its
tenant's share and the budget at once, counting every recorded cache and every live reservation;
its record then replaces the reservation (``COMMIT``, checked once more with the real bytes), or
it releases the reservation when it fails. Check and charge are one Lua script on the ``{named}``
keys (``proxy.named.registry``), so replicas sharing one Redis cannot both pass a check that only
one of them fits; a reservation expires after ``RESERVATION_TTL_S`` so a crashed create frees it.

NOTE: a tenant's reservations are refused past its own share first, so another tenant's create
is only refused as "full" by what others hold within their shares.

Keys (beside the registry's): ``{prefix}{named}:bytes`` hash, record member -> bytes;
``{prefix}{named}:held`` hash, reservation member -> bytes; ``{prefix}{named}:held:until``
sorted set, reservation member -> expiry (Unix seconds). Members start with the tenant's digest
and a colon.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

RESERVATION_TTL_S = 600
"""Seconds a reservation lasts unless its create commits or releases it first (a crashed create's
bytes are free again after this; a create that takes longer is checked again when it commits)."""


class Limits(NamedTuple):
    """Bytes a tenant's named caches may pin (``share``) and all tenants' together (``budget``)."""

    share: int
    budget: int


class Refusal(NamedTuple):
    """Why bytes were not charged: past the tenant's ``share`` or the whole ``budget``; ``own`` is
    what the tenant's caches and reservations already hold (its own figure, safe to tell it)."""

    limit: Literal["share", "budget"]
    own: int


def refusal(charges: Iterable[tuple[str, int]], prefix: str, need: int, limits: Limits) -> Refusal | None:
    """Whether ``need`` more bytes of the tenant whose members start with ``prefix`` fit beside
    ``charges`` (member, bytes: every record and live reservation); None when they do."""
    own = every = 0
    for member, size in charges:
        every += size
        own += size if member.startswith(prefix) else 0
    if own + need > limits.share:
        return Refusal("share", own)
    return Refusal("budget", own) if every + need > limits.budget else None


def answer(found: list[int]) -> Refusal | None:
    """A script's ``{code, own}`` as a ``Refusal`` (code 0: charged)."""
    code, own = int(found[0]), int(found[1])
    return None if code == 0 else Refusal("share" if code == 1 else "budget", own)


# The scripts' shared part. KEYS[1] record bytes, KEYS[2] reservations, KEYS[3] their expiries.
_COMMON = """
local function purge(now)
  local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, member in ipairs(old) do redis.call('HDEL', KEYS[2], member) end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now) end
end
local function refusal(prefix, skip, need, share, budget)
  local own, every = 0, 0
  for k = 1, 2 do
    local flat = redis.call('HGETALL', KEYS[k])
    for i = 1, #flat, 2 do
      if flat[i] ~= skip then
        local size = tonumber(flat[i + 1])
        every = every + size
        if string.sub(flat[i], 1, #prefix) == prefix then own = own + size end
      end
    end
  end
  if own + need > share then return {1, own} end
  if every + need > budget then return {2, own} end
  return {0, own}
end
"""

# RESERVE: ARGV[1] now, [2] tenant prefix, [3] reservation member, [4] bytes, [5] share,
# [6] budget, [7] expiry of the reservation. Returns {0 charged | 1 share | 2 budget, own bytes}.
RESERVE = (
    _COMMON
    + """
purge(ARGV[1])
local found = refusal(ARGV[2], '', tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
if found[1] == 0 then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[7], ARGV[3])
end
return found
"""
)

# COMMIT: a reservation becomes a record, if the record's bytes fit without it.
#   KEYS[4] record, [5] tenant's ids, [6] expiry order
#   ARGV[1] now, [2] tenant prefix, [3] reservation member, [4] record member, [5] bytes,
#   [6] share, [7] budget, [8] record JSON, [9] expiry, [10] id. Returns as RESERVE.
COMMIT = (
    _COMMON
    + """
purge(ARGV[1])
local found = refusal(ARGV[2], ARGV[3], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
if found[1] == 0 then
  redis.call('HDEL', KEYS[2], ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('SET', KEYS[4], ARGV[8])
  redis.call('SADD', KEYS[5], ARGV[10])
  redis.call('ZADD', KEYS[6], ARGV[9], ARGV[4])
  redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
end
return found
"""
)

# REPLACE: a record that is still there gets its new version (a deleted one stays deleted).
#   KEYS[1] record, [2] expiry order   ARGV[1] record JSON, [2] expiry, [3] member. Returns 1 or 0.
REPLACE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
