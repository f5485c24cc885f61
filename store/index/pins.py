"""What the cache's facade needs of pinned blocks: those of named caches (``CacheAdmin.pin``),
which the byte budget never evicts (the ``pinned`` class of ``store.index.retention``); their
bytes are counted apart, against a budget of their own.

``store.index.redis.pins`` implements the contract on Redis and ``store.index.memory.pins`` in
this process; each index hands out its own (``BlockIndex.pins``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from hashing import BlockHash, Namespace


class Pinning(NamedTuple):
    """What ``Pins.pin`` did: bytes newly pinned (a block pinned already is not new), bytes of
    the chain's stored blocks, and how many of its blocks are not stored (yet)."""

    added: int
    held: int
    missing: int


class Pins(Protocol):
    """Pinned blocks of one index. Methods may raise the backend's fault (``redis.RedisError``)."""

    def pin(self, namespace: Namespace, hashes: Sequence[BlockHash], ttl_s: int) -> Pinning:
        """Pin the chain ``hashes``: those stored have their TTL raised to ``ttl_s`` seconds at
        least; those not stored yet are pinned as they are published."""
        ...

    def unpin(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Release one pin of each block: one no pin holds takes its TTL's class again."""
        ...

    def pinned_bytes(self) -> int:
        """Bytes of the pinned blocks, over every namespace."""
        ...
