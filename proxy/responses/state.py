"""Stored responses: what ``previous_response_id`` continues from, kept in the Redis the cache
uses, so a response survives a restart and every replica (and ``kvproxy route``) sees it.

A stored response (``StoredResponse``) holds the response object, its input items, the
conversation through its output as chat messages (instructions aside: a request's own apply),
and where a continuation starts (``proxy.responses.continuation``: the token ids its turn
computed). Each is self-contained: continuing a response reads one key.

Keys (under ``key_prefix``; ``{responses}`` is a Redis Cluster hash tag, so a store and its
eviction are one script on one node). A *member* is ``{tenant digest}:{response id}``:

    ``{prefix}{responses}:r:{member}``  the stored response (JSON), expiring ``--responses-ttl``
                                        seconds after it was created
    ``{prefix}{responses}:s:{member}``  "seen", a week longer: an expired or evicted id is told
                                        apart from one that never existed (of this tenant)
    ``{prefix}{responses}:order``       sorted set: member -> expiry time (Unix seconds, to the µs)
    ``{prefix}{responses}:sizes``       hash: member -> bytes; ``:bytes`` their sum, kept within
                                        ``--responses-max-bytes`` by evicting the oldest first
    ``{prefix}{responses}:t:{tenant digest}:order``, ``...:bytes``  the same for one tenant: kept
                                        within its share (``Settings.tenant_budget``) by evicting
                                        that tenant's own oldest first

A response id is looked up under the caller's tenant only: another tenant's id is not found.
A tenant's put evicts its own oldest responses while it holds more than its share, then the
oldest of any tenant while all together pass the budget (which happens only when more tenants
than ``1 / --tenant-share`` hold their share): one tenant's traffic never evicts another's
stored conversations while that one keeps within its share.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Literal, Protocol

import redis
import xxhash
from fastapi import Depends, Request

from proxy.responses.continuation import Continuation
from proxy.responses.replies import InputItem, ResponseObject
from proxy.responses.scripts import DELETE, PUT
from proxy.tools.rendering import TemplateMessage

SEEN_EXTRA_S = 7 * 86_400
"""How much longer than a response its "seen" marker lives."""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response.

    Attributes:
        response: the response object, as ``GET /v1/responses/{id}`` returns it.
        input_items: this request's input items (``proxy.responses.items.input_items``).
        conversation: the chat messages through this response's output, without instructions.
        continuation: where a continuation starts (None: where it could not be rendered).
    """

    response: ResponseObject
    input_items: list[InputItem]
    conversation: list[TemplateMessage]
    continuation: Continuation | None

    def dumps(self) -> str:
        """As JSON, the continuation's token ids as base64 of little-endian uint32 (4 bytes a token)."""
        doc = asdict(self)
        if (after := self.continuation) is not None:
            ids = base64.b64encode(struct.pack(f"<{len(after.token_ids)}I", *after.token_ids)).decode()
            doc["continuation"] |= {"token_ids": ids}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str | bytes) -> StoredResponse:
        doc = json.loads(text)
        after = doc["continuation"]
        if after is not None:
            raw = base64.b64decode(after["token_ids"])
            after = Continuation(
                list(struct.unpack(f"<{len(raw) // 4}I", raw)), after["rendered"], after["digest"]
            )
        return cls(doc["response"], doc["input_items"], doc["conversation"], after)


class ResponseStore(Protocol):
    """Where responses are kept. Every method may raise ``redis.RedisError``."""

    def put(self, tenant: str, stored: StoredResponse) -> None:
        """Keep ``stored`` under its response's id for ``tenant``."""

    def get(self, tenant: str, response_id: str) -> StoredResponse | Literal["gone"] | None:
        """The stored response; ``"gone"`` when it expired or was evicted; None when ``tenant``
        never stored it (or deleted it)."""

    def delete(self, tenant: str, response_id: str) -> bool:
        """Remove a response; whether it was there."""


def member(tenant: str, response_id: str) -> str:
    return f"{xxhash.xxh3_64_hexdigest(tenant.encode())}:{response_id}"


class RedisResponses:
    """``ResponseStore`` on Redis (see the module docstring).

    Args:
        client: a Redis, Sentinel or Cluster client (``store.index.redis.connect``).
        ttl_s: seconds a response is kept after it was created.
        max_bytes: the budget of every stored response together (bytes of JSON).
        tenant_bytes: one tenant's share of it (None: the whole budget).
    """

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str,
        ttl_s: int,
        max_bytes: int,
        tenant_bytes: int | None = None,
    ) -> None:
        self.client, self.ttl_s, self.max_bytes = client, ttl_s, max_bytes
        self.tenant_bytes = max_bytes if tenant_bytes is None else tenant_bytes
        self.base = f"{key_prefix}{{responses}}:"
        self._put, self._delete = client.register_script(PUT), client.register_script(DELETE)

    def _keys(self) -> list[str]:
        return [f"{self.base}sizes", f"{self.base}order", f"{self.base}bytes"]

    def put(self, tenant: str, stored: StoredResponse) -> None:
        name, now = member(tenant, stored.response["id"]), time.time()
        args: list[str | int] = [
            self.base,
            name,
            stored.dumps(),
            self.ttl_s,
            self.ttl_s + SEEN_EXTRA_S,
            f"{now + self.ttl_s:.6f}",
            f"{now:.6f}",
            self.max_bytes,
            self.tenant_bytes,
        ]
        self._put(keys=self._keys(), args=args)

    def get(self, tenant: str, response_id: str) -> StoredResponse | Literal["gone"] | None:
        name = member(tenant, response_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(f"{self.base}r:{name}")
        pipe.exists(f"{self.base}s:{name}")
        text, was_seen = pipe.execute()
        if text is not None:
            return StoredResponse.loads(text)
        return "gone" if was_seen else None

    def delete(self, tenant: str, response_id: str) -> bool:
        return bool(self._delete(keys=self._keys(), args=[self.base, member(tenant, response_id)]))


class MemoryResponses:
    """``ResponseStore`` in this process (``--redis-url memory://``): forgotten at restart. The
    same budgets as ``RedisResponses``: the tenant's share first, then the whole."""

    def __init__(self, ttl_s: int, max_bytes: int, tenant_bytes: int | None = None) -> None:
        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self.tenant_bytes = max_bytes if tenant_bytes is None else tenant_bytes
        self._lock = threading.Lock()
        self._records: dict[str, tuple[float, str]] = {}  # member -> (expires at, JSON), oldest first
        self._own: dict[str, dict[str, int]] = {}  # tenant digest -> {member: bytes}, oldest first
        self._bytes = 0
        self._seen: dict[str, float] = {}

    def put(self, tenant: str, stored: StoredResponse) -> None:
        name, now = member(tenant, stored.response["id"]), time.time()
        text = stored.dumps()
        with self._lock:
            # NOTE: one TTL for all: the oldest are the first to expire
            while self._records and next(iter(self._records.values()))[0] <= now:
                self._drop(next(iter(self._records)))
            self._drop(name)
            self._records[name] = (now + self.ttl_s, text)
            own = self._own.setdefault(_digest(name), {})
            own[name], self._bytes = len(text), self._bytes + len(text)
            self._seen[name] = now + self.ttl_s + SEEN_EXTRA_S
            held = sum(own.values())
            while held > self.tenant_bytes and (oldest := next(iter(own))) != name:
                held -= own[oldest]
                self._drop(oldest)
            while self._bytes > self.max_bytes and next(iter(self._records)) != name:
                self._drop(next(iter(self._records)))

    def _drop(self, name: str) -> bool:
        if self._records.pop(name, None) is None:
            return False
        own = self._own[_digest(name)]
        self._bytes -= own.pop(name)
        if not own:
            del self._own[_digest(name)]
        return True

    def get(self, tenant: str, response_id: str) -> StoredResponse | Literal["gone"] | None:
        name, now = member(tenant, response_id), time.time()
        with self._lock:
            expires, text = self._records.get(name, (0.0, ""))
            if expires > now:
                return StoredResponse.loads(text)
            return "gone" if self._seen.get(name, 0.0) > now else None

    def delete(self, tenant: str, response_id: str) -> bool:
        name = member(tenant, response_id)
        with self._lock:
            self._seen.pop(name, None)
            return self._drop(name)


def _digest(name: str) -> str:
    """The tenant digest a member starts with."""
    return name.partition(":")[0]


def get_responses(request: Request) -> ResponseStore:
    """The app's response store (``proxy.stores.open_responses``)."""
    responses: ResponseStore = request.app.state.responses
    return responses


ResponsesDep = Annotated[ResponseStore, Depends(get_responses)]
