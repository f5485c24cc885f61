"""The tails' listings in Redis (the ``tails`` hash of ``store.index.redis.keys``): refreshing a
tail a lookup served, pruning expired ones, and reading them from a MATCH reply. The scripts are
``store.index.redis.scripts``' TOUCH and PRUNE; MATCH, PUBLISH and FORGET keep the listings
in step with the entries."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import redis

from hashing import BlockHash, Namespace
from store.entries import member_name
from store.index.base import TAIL_AGE_S, TailListing
from store.index.redis import scripts
from store.index.redis.keys import IndexKeys

PRUNE_BATCH = 64
"""Tips one PRUNE call looks at."""


class TailListings:
    """The tails hashes of every namespace under ``keys``' prefix. Methods may raise
    ``redis.RedisError``."""

    def __init__(self, client: redis.Redis, keys: IndexKeys) -> None:
        self.client, self.keys = client, keys
        self._touch = client.register_script(scripts.TOUCH)
        self._prune = client.register_script(scripts.PRUNE)

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


def parse_tails(raw: bytes | str) -> list[TailListing]:
    """The tails of a MATCH reply (a JSON list of [hex, length, short hex, expires]); an item
    that does not parse is skipped."""
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
    return out
