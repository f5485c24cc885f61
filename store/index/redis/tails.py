"""The tails' listings in Redis (the ``tails`` hash of ``store.index.redis.keys``): refreshing a
tail a lookup served, pruning expired ones (the scripts TOUCH and PRUNE, legends as in
``store.index.redis.scripts``), and reading them from a MATCH reply. MATCH, PUBLISH and FORGET
keep the listings in step with the entries."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from hashing import BlockHash, Namespace
from store.entries import IndexEntry, member_name
from store.index.base import TAIL_AGE_S, Matched, TailListing
from store.index.redis import scripts
from store.index.redis.keys import IndexKeys
from store.index.redis.retention import RETENTION

PRUNE_BATCH = 64
"""Tips one PRUNE call looks at."""

# TOUCH: refresh a tail a lookup served: its TTL (never shortened), LRU position, listed expiry.
#   KEYS[1] LRU sorted set   KEYS[2] tails hash   KEYS[3] the tail's entry key
#   ARGV[1] now (Unix seconds)   ARGV[2] TTL (s)   ARGV[3] member name   ARGV[4] tails field
#   ARGV[5] tail hash (hex)   ARGV[6] its chain position   ARGV[7] TAIL_AGE_S
TOUCH = (
    scripts.LIVE_TAILS
    + RETENTION
    + """
if redis.call('EXPIRE', KEYS[3], ARGV[2], 'GT') == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
local now = tonumber(ARGV[1])
local offset = lru_offset(redis.call('TTL', KEYS[3]))
redis.call('ZADD', KEYS[1], 'XX', now - tonumber(ARGV[7]) - tonumber(ARGV[6]) * 1e-6 + offset, ARGV[3])
local tails = live_tails(KEYS[2], ARGV[4], now, nil)
for _, item in ipairs(tails) do
  if item[1] == ARGV[5] then item[4] = math.max(tonumber(item[4]), now + tonumber(ARGV[2])) end
end
if #tails > 0 then redis.call('HSET', KEYS[2], ARGV[4], cjson.encode(tails)) end
return 1
"""
)

# PRUNE: drop expired tails from the listings of some tips.
#   KEYS[1] tails hash   ARGV[1] now (Unix seconds)   ARGV[1 + i] tip i's field
PRUNE = (
    scripts.LIVE_TAILS
    + """
for i = 2, #ARGV do live_tails(KEYS[1], ARGV[i], tonumber(ARGV[1]), nil) end
"""
)


class TailListings:
    """The tails hashes of every namespace under ``keys``' prefix. Methods may raise
    ``redis.RedisError``."""

    def __init__(self, client: redis.Redis, keys: IndexKeys) -> None:
        self.client, self.keys = client, keys
        self._touch = client.register_script(TOUCH)
        self._prune = client.register_script(PRUNE)

    def touch(
        self, namespace: Namespace, tip: BlockHash | None, tail_hash: BlockHash, ttl_s: int, position: int
    ) -> None:
        """Refresh a served tail: its entry's TTL to at least ``ttl_s`` seconds, its LRU position
        (chain ``position``), its listed expiry (one script, one round trip)."""
        ns = namespace.hex()
        keys = [self.keys.of(ns, "lru"), self.keys.of(ns, "tails"), self.keys.block(namespace, tail_hash)]
        member = member_name(namespace, tail_hash)
        args: list[str | float] = [
            time.time(),
            ttl_s,
            member,
            scripts.tails_field(tip),
            tail_hash.hex(),
            position,
        ]
        args.append(TAIL_AGE_S)
        self._touch(keys=keys, args=args)

    def prune(self, namespaces: Iterable[str]) -> None:
        """Drop expired tails from the listings of ``namespaces`` (hex): HSCAN, then one script
        per ``PRUNE_BATCH`` tips (safe while others write)."""
        for ns in namespaces:
            key = self.keys.of(ns, "tails")
            fields = [f.decode() for f, _ in self.client.hscan_iter(key, count=PRUNE_BATCH)]
            for start in range(0, len(fields), PRUNE_BATCH):
                self._prune(keys=[key], args=[time.time(), *fields[start : start + PRUNE_BATCH]])


def parse_match(reply: Sequence[Any]) -> Matched:
    """A MATCH reply as ``Matched``: an entry that does not parse ends the chain, and then no tail
    is listed."""
    raws, seen, listed, candidate = reply
    entries: list[IndexEntry] = []
    for raw in raws:
        try:
            entries.append(IndexEntry.from_json(raw))
        except (ValueError, KeyError, TypeError):
            break
    parsed = len(entries) == len(raws)
    return Matched(
        entries, bool(seen), parse_tails(listed) if parsed else [], int(candidate) if parsed else 0
    )


def parse_tails(raw: bytes | str) -> list[TailListing]:
    """The tails of a MATCH reply (a JSON list of [hex, length, short hex, expires, ids]); an
    item that does not parse is skipped, and ids that do not parse (or an item without them) are
    None."""
    out: list[TailListing] = []
    try:
        items = json.loads(raw)
    except ValueError:
        return out
    for item in items if isinstance(items, list) else []:
        try:
            short = BlockHash(bytes.fromhex(item[2])) if item[2] else None
            out.append(TailListing(BlockHash(bytes.fromhex(item[0])), int(item[1]), short))
        except (ValueError, TypeError, IndexError):
            continue
        out[-1] = out[-1]._replace(token_ids=parse_ids(item[4] if len(item) > 4 else None))
    return out


def parse_ids(text: object) -> tuple[int, ...] | None:
    """A listed tail's token ids (``scripts.tail_ids_text``), or None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        return None
