"""The route index ``kvproxy route`` shares between its processes: which replica has seen which
prompt blocks, each replica's epoch, and the requests in flight per replica.

Keys (under ``key_prefix``; the part in braces is a Redis Cluster hash tag, so the keys of one
namespace share a slot and a chain lookup stays one round trip on one node):

    ``{prefix}{ns_hex}:r:{hash_hex}``  hash: replica -> epoch in which it was sent the block;
                                        sliding TTL (``--route-ttl``)
    ``{prefix}{route}:epochs``         hash: replica -> epoch; bumped when a replica comes back
                                        or restarts, so the entries it had stop counting
    ``{prefix}{route}:resp:{tenant}:{id}``  the replica that answered a Responses request of
                                        that id (tenant: a digest); TTL ``--route-ttl``. A
                                        request continuing it goes there (affinity). The same
                                        for a tenant's ``prompt_cache_key:{digest}``, and for its
                                        named cache ``cachedContents/{id}`` (TTL: the cache's
                                        expiry): the replica holding it.
    ``{prefix}{route}:inflight``       hash: ``"{router}|{replica}"`` -> requests in flight that
                                        router sent; ``"{router}|@"`` -> its last heartbeat (Unix
                                        seconds). A router silent for ``STALE_ROUTER_S`` seconds
                                        (it died mid-request) no longer counts, and its fields go.

Every method may raise ``redis.RedisError``; the router degrades to local counts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import redis
import xxhash

from hashing import BlockHash, Namespace

STALE_ROUTER_S = 30.0

# MATCH: per replica, how many leading blocks of the chain it was sent in its current epoch.
#   KEYS[i]  block i's route key (chain order)
#   ARGV[1]  TTL (s) given to every block some replica still matches
#   ARGV[2r], ARGV[2r+1]  replica r's name and current epoch
# Returns one count per replica, in ARGV order.
_MATCH = """
local n = (#ARGV - 1) / 2
local counts, alive = {}, {}
for r = 1, n do counts[r] = 0; alive[r] = true end
for i, key in ipairs(KEYS) do
  local any = false
  for r = 1, n do
    if alive[r] then
      if redis.call('HGET', key, ARGV[2 * r]) == ARGV[2 * r + 1] then
        counts[r] = i; any = true
      else
        alive[r] = false
      end
    end
  end
  if not any then break end
  redis.call('EXPIRE', key, ARGV[1])
end
return counts
"""

# RECORD: a replica was sent these blocks.
#   KEYS[i]  block i's route key    ARGV[1] replica    ARGV[2] its epoch    ARGV[3] TTL (s)
_RECORD = """
for _, key in ipairs(KEYS) do
  redis.call('HSET', key, ARGV[1], ARGV[2])
  redis.call('EXPIRE', key, ARGV[3])
end
return #KEYS
"""

# LOADS: requests in flight per replica, over the routers alive; drops the fields of dead ones.
#   KEYS[1]  the in-flight hash    ARGV[1]  now (Unix seconds)    ARGV[2]  stale after (s)
# Returns {replica, count, replica, count, ...}.
_LOADS = """
local fields = redis.call('HGETALL', KEYS[1])
local beat, dead, totals = {}, {}, {}
for i = 1, #fields, 2 do
  local router, what = string.match(fields[i], '^(.*)|(.*)$')
  if what == '@' then beat[router] = tonumber(fields[i + 1]) end
end
for i = 1, #fields, 2 do
  local router, what = string.match(fields[i], '^(.*)|(.*)$')
  if not beat[router] or tonumber(ARGV[1]) - beat[router] > tonumber(ARGV[2]) then
    table.insert(dead, fields[i])
  elseif what ~= '@' then
    totals[what] = (totals[what] or 0) + math.max(0, tonumber(fields[i + 1]))
  end
end
if #dead > 0 then redis.call('HDEL', KEYS[1], unpack(dead)) end
local out = {}
for replica, count in pairs(totals) do table.insert(out, replica); table.insert(out, count) end
return out
"""


class RouteIndex:
    """The shared route index (see the module docstring) for one router process ``router_id``."""

    def __init__(self, client: redis.Redis, key_prefix: str, router_id: str) -> None:
        self.client, self.key_prefix, self.router_id = client, key_prefix, router_id
        self.epochs_key = f"{key_prefix}{{route}}:epochs"
        self.inflight_key = f"{key_prefix}{{route}}:inflight"
        self._match = client.register_script(_MATCH)
        self._record = client.register_script(_RECORD)
        self._loads = client.register_script(_LOADS)

    def block_key(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return f"{self.key_prefix}{{{namespace.hex()}}}:r:{block_hash.hex()}"

    def match(
        self, namespace: Namespace, hashes: Sequence[BlockHash], epochs: Mapping[str, int], ttl_s: int
    ) -> dict[str, int]:
        """Leading blocks of ``hashes`` each replica was sent in its current epoch (one round
        trip); refreshes the TTL of the blocks some replica matches."""
        if not hashes or not epochs:
            return dict.fromkeys(epochs, 0)
        argv: list[str | int] = [ttl_s]
        for replica, epoch in epochs.items():
            argv += [replica, epoch]
        counts = self._match(keys=[self.block_key(namespace, h) for h in hashes], args=argv)
        return {replica: int(c) for replica, c in zip(epochs, counts, strict=True)}

    def record(
        self, namespace: Namespace, hashes: Sequence[BlockHash], replica: str, epoch: int, ttl_s: int
    ) -> None:
        """Note that ``replica`` (in ``epoch``) was sent the blocks ``hashes``."""
        if hashes:
            keys = [self.block_key(namespace, h) for h in hashes]
            self._record(keys=keys, args=[replica, epoch, ttl_s])

    def response_key(self, tenant: str, response_id: str) -> str:
        return f"{self.key_prefix}{{route}}:resp:{xxhash.xxh3_64_hexdigest(tenant.encode())}:{response_id}"

    def remember_response(self, tenant: str, response_id: str, replica: str, ttl_s: int) -> None:
        """``replica`` answered ``tenant``'s response ``response_id``."""
        self.client.set(self.response_key(tenant, response_id), replica, ex=ttl_s)

    def forget_response(self, tenant: str, response_id: str) -> None:
        """Forget which replica holds ``tenant``'s ``response_id``."""
        self.client.delete(self.response_key(tenant, response_id))

    def response_replica(self, tenant: str, response_id: str) -> str | None:
        """The replica that answered ``tenant``'s response ``response_id`` (None: not known)."""
        found = self.client.get(self.response_key(tenant, response_id))
        return None if found is None else _text(found)

    def epochs(self, replicas: Sequence[str]) -> dict[str, int]:
        """Each replica's current epoch (0 before its first bump)."""
        values = self.client.hmget(self.epochs_key, list(replicas))
        return {r: int(v or 0) for r, v in zip(replicas, values, strict=True)}

    def bump_epoch(self, replica: str) -> int:
        """Start a new epoch for ``replica``: everything it was sent before stops counting."""
        return int(self.client.hincrby(self.epochs_key, replica, 1))

    def add_inflight(self, replica: str, delta: int) -> None:
        """Count a request this router sent to ``replica`` (+1) or that ended there (-1)."""
        self.client.hincrby(self.inflight_key, f"{self.router_id}|{replica}", delta)

    def heartbeat(self) -> None:
        """Mark this router alive, so its in-flight counts keep counting."""
        self.client.hset(self.inflight_key, f"{self.router_id}|@", f"{time.time():.3f}")

    def loads(self) -> dict[str, int]:
        """Requests in flight per replica, summed over every live router."""
        flat = self._loads(keys=[self.inflight_key], args=[f"{time.time():.3f}", STALE_ROUTER_S])
        return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def clear(self) -> None:
        """Forget this router's in-flight counts and heartbeat (at shutdown)."""
        fields = [
            f for f in self.client.hkeys(self.inflight_key) if _text(f).startswith(f"{self.router_id}|")
        ]
        if fields:
            self.client.hdel(self.inflight_key, *fields)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
