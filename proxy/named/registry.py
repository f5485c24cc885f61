"""Named caches (Gemini's ``cachedContents``): the records, kept in the Redis the cache uses so every
replica sees them, scoped to the tenant that created them.

A record (``NamedCache``) holds the content as chat messages (rendered again by each request
that uses it), the chain of block hashes it pins in its tenant's namespace
(``store.index.pins.Pins``), and its expiry. The pins are released once: by whoever removes
the record (``delete`` says whether it was there), when its tenant deletes it or when it expires
(``NamedCaches.expired``, swept by ``proxy.named.service``).

Keys (under ``key_prefix``; ``{named}`` is a Redis Cluster hash tag, so one MULTI touches one
node). A *member* is ``{tenant digest}:{id}``:

    ``{prefix}{named}:r:{member}``  the record (JSON)
    ``{prefix}{named}:t:{tenant digest}``  set of the tenant's ids (its listing)
    ``{prefix}{named}:expiry``      sorted set: member -> expiry (Unix seconds)

and the pinned bytes charged to each record and to each create under way (``proxy.named.ledger``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

import redis
import xxhash

from proxy.named.ledger import COMMIT, REPLACE, RESERVATION_TTL_S, RESERVE, Limits, Refusal, answer, refusal
from proxy.tools.rendering import TemplateMessage


@dataclass(frozen=True)
class NamedCache:
    """One named cache.

    Attributes:
        id: its id; the API's name is ``cachedContents/{id}``.
        model: the served model it was made for.
        display_name: the creator's label ("" for none).
        messages: the content as chat messages (``role``, ``content`` text), system first.
        namespace: hex of the namespace its blocks are in (model, format and tenant).
        block_hashes: hex of the full blocks it pins, in chain order.
        tokens: the content's length in tokens, rendered without a generation prompt.
        block_bytes: bytes of the pinned blocks' blobs.
        created, updated, expires: Unix seconds.
    """

    id: str
    model: str
    display_name: str
    messages: list[TemplateMessage]
    namespace: str
    block_hashes: list[str]
    tokens: int
    block_bytes: int
    created: float
    updated: float
    expires: float
    tenant_digest: str = field(default="")

    @property
    def name(self) -> str:
        return f"cachedContents/{self.id}"

    def dumps(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str | bytes) -> NamedCache:
        return cls(**json.loads(text))


def tenant_digest(tenant: str) -> str:
    return xxhash.xxh3_64_hexdigest(tenant.encode())


class NamedCaches(Protocol):
    """Where named caches are kept. Every method may raise ``redis.RedisError``."""

    def put(self, tenant: str, cache: NamedCache) -> None:
        """Keep (or replace) ``cache`` under its id for ``tenant``."""

    def get(self, tenant: str, cache_id: str) -> NamedCache | None:
        """``tenant``'s cache ``cache_id`` (None: none, or another tenant's)."""

    def of_tenant(self, tenant: str) -> list[NamedCache]:
        """``tenant``'s caches, oldest first."""

    def delete(self, tenant_hex: str, cache_id: str) -> NamedCache | None:
        """Remove a cache (``tenant_hex``: ``tenant_digest`` of its tenant); the record when this
        call removed it (its pins are then the caller's to release), else None."""

    def expired(self, now: float) -> list[NamedCache]:
        """The caches (of every tenant) whose expiry is at or before ``now``."""

    def every(self) -> list[NamedCache]:
        """Every cache, of every tenant."""

    def reserve(self, tenant: str, ticket: str, need: int, limits: Limits) -> Refusal | None:
        """Charge ``need`` bytes to a create of ``tenant``'s under way (``ticket``, its id) for
        ``RESERVATION_TTL_S`` at most, if they fit beside every record and reservation; else
        why not (``proxy.named.ledger``)."""

    def commit(self, tenant: str, ticket: str, cache: NamedCache, limits: Limits) -> Refusal | None:
        """Keep ``cache`` in place of the reservation ``ticket`` if its ``block_bytes`` fit beside
        every other record and reservation; else why not (and nothing is kept)."""

    def release(self, tenant: str, ticket: str) -> None:
        """Drop the reservation ``ticket`` (none: nothing happens)."""

    def replace(self, tenant: str, cache: NamedCache) -> bool:
        """Keep ``cache``'s new version if its record is still there; whether it was."""


class RedisNamedCaches:
    """``NamedCaches`` on Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis, key_prefix: str) -> None:
        self.client, self.base = client, f"{key_prefix}{{named}}:"
        self.ledger = [f"{self.base}bytes", f"{self.base}held", f"{self.base}held:until"]
        self._reserve, self._commit = client.register_script(RESERVE), client.register_script(COMMIT)
        self._replace = client.register_script(REPLACE)

    def put(self, tenant: str, cache: NamedCache) -> None:
        digest = tenant_digest(tenant)
        member = f"{digest}:{cache.id}"
        pipe = self.client.pipeline(transaction=True)
        pipe.set(f"{self.base}r:{member}", dataclasses.replace(cache, tenant_digest=digest).dumps())
        pipe.sadd(f"{self.base}t:{digest}", cache.id)
        pipe.zadd(f"{self.base}expiry", {member: cache.expires})
        pipe.hset(self.ledger[0], member, cache.block_bytes)
        pipe.execute()

    def reserve(self, tenant: str, ticket: str, need: int, limits: Limits) -> Refusal | None:
        digest, now = tenant_digest(tenant), time.time()
        args = [now, f"{digest}:", f"{digest}:{ticket}", need, *limits, now + RESERVATION_TTL_S]
        return answer(self._reserve(keys=self.ledger, args=args))  # type: ignore[arg-type]

    def commit(self, tenant: str, ticket: str, cache: NamedCache, limits: Limits) -> Refusal | None:
        digest = tenant_digest(tenant)
        member, text = f"{digest}:{cache.id}", dataclasses.replace(cache, tenant_digest=digest).dumps()
        keys = [*self.ledger, f"{self.base}r:{member}", f"{self.base}t:{digest}", f"{self.base}expiry"]
        args = [time.time(), f"{digest}:", f"{digest}:{ticket}", member, cache.block_bytes, *limits]
        found = self._commit(keys=keys, args=[*args, text, cache.expires, cache.id])  # type: ignore[list-item]
        return answer(found)  # type: ignore[arg-type]

    def release(self, tenant: str, ticket: str) -> None:
        member = f"{tenant_digest(tenant)}:{ticket}"
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.ledger[1], member)
        pipe.zrem(self.ledger[2], member)
        pipe.execute()

    def replace(self, tenant: str, cache: NamedCache) -> bool:
        digest = tenant_digest(tenant)
        member, text = f"{digest}:{cache.id}", dataclasses.replace(cache, tenant_digest=digest).dumps()
        keys = [f"{self.base}r:{member}", f"{self.base}expiry"]
        return bool(self._replace(keys=keys, args=[text, cache.expires, member]))

    def get(self, tenant: str, cache_id: str) -> NamedCache | None:
        text = self.client.get(f"{self.base}r:{tenant_digest(tenant)}:{cache_id}")
        return None if text is None else NamedCache.loads(text)  # type: ignore[arg-type]

    def of_tenant(self, tenant: str) -> list[NamedCache]:
        digest = tenant_digest(tenant)
        ids = sorted(m.decode() for m in self.client.smembers(f"{self.base}t:{digest}"))  # type: ignore[union-attr]
        texts = self.client.mget([f"{self.base}r:{digest}:{i}" for i in ids]) if ids else []
        found = [NamedCache.loads(t) for t in texts if t is not None]  # type: ignore[union-attr]
        return sorted(found, key=lambda c: c.created)

    def delete(self, tenant_hex: str, cache_id: str) -> NamedCache | None:
        member = f"{tenant_hex}:{cache_id}"
        pipe = self.client.pipeline(transaction=True)
        pipe.getdel(f"{self.base}r:{member}")
        pipe.srem(f"{self.base}t:{tenant_hex}", cache_id)
        pipe.zrem(f"{self.base}expiry", member)
        pipe.hdel(self.ledger[0], member)
        text = pipe.execute()[0]
        return None if text is None else NamedCache.loads(text)

    def every(self) -> list[NamedCache]:
        return self.expired(float("inf"), None)

    def expired(self, now: float, most: int | None = 100) -> list[NamedCache]:
        page = (0, most) if most is not None else (None, None)
        members: list[bytes] = self.client.zrangebyscore(f"{self.base}expiry", "-inf", now, *page)  # type: ignore[assignment]
        texts: list[bytes | None] = (
            self.client.mget([f"{self.base}r:{m.decode()}" for m in members]) if members else []  # type: ignore[assignment]
        )
        out = [NamedCache.loads(t) for t in texts if t is not None]
        gone = [m for m, t in zip(members, texts, strict=True) if t is None]
        if gone:  # NOTE: records Redis lost: their bytes are no longer charged either
            self.client.zrem(f"{self.base}expiry", *gone)
            self.client.hdel(self.ledger[0], *gone)
        return out


class MemoryNamedCaches:
    """``NamedCaches`` in this process (``--redis-url memory://``): forgotten at restart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], NamedCache] = {}  # (tenant digest, id) -> record
        self._held: dict[str, tuple[int, float]] = {}  # reservation member -> (bytes, expiry)

    def put(self, tenant: str, cache: NamedCache) -> None:
        digest = tenant_digest(tenant)
        with self._lock:
            self._records[(digest, cache.id)] = dataclasses.replace(cache, tenant_digest=digest)

    def get(self, tenant: str, cache_id: str) -> NamedCache | None:
        with self._lock:
            return self._records.get((tenant_digest(tenant), cache_id))

    def of_tenant(self, tenant: str) -> list[NamedCache]:
        digest = tenant_digest(tenant)
        with self._lock:
            return sorted((c for (t, _), c in self._records.items() if t == digest), key=lambda c: c.created)

    def delete(self, tenant_hex: str, cache_id: str) -> NamedCache | None:
        with self._lock:
            return self._records.pop((tenant_hex, cache_id), None)

    def expired(self, now: float) -> list[NamedCache]:
        with self._lock:
            return [c for c in self._records.values() if c.expires <= now]

    def reserve(self, tenant: str, ticket: str, need: int, limits: Limits) -> Refusal | None:
        digest, now = tenant_digest(tenant), time.time()
        with self._lock:
            found = refusal(self._charges(now, ""), f"{digest}:", need, limits)
            if found is None:
                self._held[f"{digest}:{ticket}"] = (need, now + RESERVATION_TTL_S)
            return found

    def commit(self, tenant: str, ticket: str, cache: NamedCache, limits: Limits) -> Refusal | None:
        digest = tenant_digest(tenant)
        with self._lock:
            mine = f"{digest}:{ticket}"
            found = refusal(self._charges(time.time(), mine), f"{digest}:", cache.block_bytes, limits)
            if found is None:
                self._held.pop(mine, None)
                self._records[(digest, cache.id)] = dataclasses.replace(cache, tenant_digest=digest)
            return found

    def release(self, tenant: str, ticket: str) -> None:
        with self._lock:
            self._held.pop(f"{tenant_digest(tenant)}:{ticket}", None)

    def replace(self, tenant: str, cache: NamedCache) -> bool:
        digest = tenant_digest(tenant)
        with self._lock:
            if (digest, cache.id) not in self._records:
                return False
            self._records[(digest, cache.id)] = dataclasses.replace(cache, tenant_digest=digest)
            return True

    def _charges(self, now: float, skip: str) -> list[tuple[str, int]]:
        """Every record's and live reservation's (member, bytes) but ``skip``'s; drops the expired
        reservations. Under the lock."""
        for member in [m for m, (_, until) in self._held.items() if until <= now]:
            del self._held[member]
        held = [(m, size) for m, (size, _) in self._held.items() if m != skip]
        return held + [(f"{t}:{i}", c.block_bytes) for (t, i), c in self._records.items()]

    def every(self) -> list[NamedCache]:
        return self.expired(float("inf"))
