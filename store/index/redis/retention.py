"""Retention classes (``store.index.retention``) in Redis: the Lua fragment the scripts score
blocks with, and the classes of the LRU sorted sets counted where they are."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from store.index.retention import CLASS_AGE_S, PIN_OFFSET, PINNED, RETENTION_CLASSES, class_middle

# RETENTION: a block's LRU offset from the seconds it is still promised (a TTL of -1, no
# expiry, is the longest), as ``lru_offset`` computes it; PIN a pinned one's.
_BANDS = [(most, (i - 1) * CLASS_AGE_S) for i, (_, most) in enumerate(RETENTION_CLASSES[:PINNED])]
RETENTION = (
    f"local PIN = {PIN_OFFSET!r}\nlocal function lru_offset(ttl)\n"
    + "".join(f"  if ttl >= 0 and ttl <= {most} then return {offset!r} end\n" for most, offset in _BANDS[:-1])
    + f"  return {_BANDS[-1][1]!r}\nend\n"
)


def sorted_set_counts(client: redis.Redis, lru_keys: Sequence[str]) -> list[int]:
    """``store.index.retention.class_counts`` of the sorted sets ``lru_keys`` now, counted in
    Redis (one pipelined round trip per node)."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for key in lru_keys:
        for k in range(len(RETENTION_CLASSES)):
            middle = class_middle(now, k)
            pipe.zcount(key, f"({middle - CLASS_AGE_S / 2}", middle + CLASS_AGE_S / 2)
    found = [int(n) for n in pipe.execute()] if lru_keys else []
    return [sum(found[k :: len(RETENTION_CLASSES)]) for k in range(len(RETENTION_CLASSES))]
