"""What a failed Redis call tells an operator: Redis too slow to answer within the timeout,
nothing answering at its address, credentials it refused, something not Redis answering there, or
another fault; each with the advice
that fits it (a slow Redis needs a longer ``--redis-timeout``, not a start).

``store/`` reads no settings: a caller that knows the URL and the timeout passes them as a
``RedisPlace``; the advice names the flags (and their ``KVPROXY_*`` variables) as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import redis
from redis.exceptions import RedisClusterUnreachableError

from store.index.embedded.lease import joined
from store.index.redis.connect import REDIS_ERRORS

RedisFaultKind = Literal["timeout", "unreachable", "auth", "not_redis", "other"]
"""Why a Redis call failed: ``timeout`` (connected, or connecting, but no answer within the
timeout: Redis is overloaded, paused or far away), ``unreachable`` (nothing answers at the
address: refused, no route, unknown host, connection closed), ``auth`` (the credentials or the
user's permissions were refused), ``not_redis`` (something answered that does not speak Redis's
protocol, RESP: an HTTP server, say), ``other`` (Redis answered with an error)."""

_AUTH = (redis.AuthenticationError, redis.exceptions.AuthorizationError, redis.exceptions.NoPermissionError)
_BUSY = (redis.exceptions.BusyLoadingError, redis.exceptions.MaxClientsReachedError)
"""Connection errors that mean Redis is there but cannot take the call now (``other``)."""
_REPR = re.compile(r"<[^<>]*>")
DETAIL_CHARS = 200


@dataclass(frozen=True)
class RedisPlace:
    """The Redis a message is about: ``url`` as logs may show it (``redact_url``'s), and
    ``timeout_s``, the seconds a call may take, None where unknown; ``timeout_name`` says where that
    timeout comes from (``--redis-timeout``, or a rule of the caller's built on it)."""

    url: str | None = None
    timeout_s: float | None = None
    timeout_name: str = "--redis-timeout"

    @property
    def name(self) -> str:
        """``Redis at URL``, or ``Redis``."""
        return "Redis" if self.url is None else f"Redis at {self.url}"


@dataclass(frozen=True)
class RedisFault:
    """A Redis failure as an operator reads it: its ``kind`` and one ``message`` saying what
    happened and what to do (``str()`` of the fault)."""

    kind: RedisFaultKind
    message: str

    def __str__(self) -> str:
        return self.message


def redis_fault(exc: BaseException, place: RedisPlace | None = None) -> RedisFault:
    """``exc`` (raised by a Redis call on ``place``) as a ``RedisFault``.

    The kind comes from the exception and its causes: a ``redis.TimeoutError`` or socket timeout
    is ``timeout``; refused credentials or a missing ACL permission ``auth``; a reply that is not
    RESP (``redis.exceptions.InvalidResponse``) ``not_redis``; any other connection error
    (refused, unknown host, closed) ``unreachable``; anything else ``other``.
    """
    place = place or RedisPlace()
    kind = fault_kind(exc)
    if kind == "timeout":
        within = (
            place.timeout_name if place.timeout_s is None else f"{place.timeout_name} ({place.timeout_s:g} s)"
        )
        return RedisFault(
            kind,
            f"{place.name} did not answer within {within}: it is overloaded, paused or far away; "
            "if it is merely slow, raise --redis-timeout (KVPROXY_REDIS_TIMEOUT)",
        )
    if kind == "unreachable":
        files = joined(place.url)
        advice = (
            "start Redis (redis-server) or set --redis-url (KVPROXY_REDIS_URL)"
            if files is None
            else f"kvproxy starts its embedded index again on its own (its log: {files.keeper_log})"
        )
        detail = _detail(exc)
        return RedisFault(kind, f"{place.name} is unreachable: nothing answers there ({detail}); {advice}")
    if kind == "auth":
        return RedisFault(
            kind,
            f"{place.name} refused the credentials ({_detail(exc)}): check the user and password in "
            "--redis-url (KVPROXY_REDIS_URL) and the user's ACL permissions",
        )
    if kind == "not_redis":
        return RedisFault(
            kind,
            f"{place.name} is not a Redis server: what answers there does not speak Redis's protocol "
            f"({_detail(exc)}); check the host and port in --redis-url (KVPROXY_REDIS_URL)",
        )
    return RedisFault(
        kind, f"{place.name} failed ({type(exc).__name__}: {_detail(exc)}): see the Redis server's log"
    )


def fault_kind(exc: BaseException) -> RedisFaultKind:
    """The ``RedisFaultKind`` of ``exc``, looking through its causes (redis-py wraps socket
    errors, the cluster client wraps redis-py's)."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, TimeoutError | redis.TimeoutError) for e in chain):
        return "timeout"  # NOTE: socket.timeout is TimeoutError
    if any(isinstance(e, _AUTH) for e in chain):
        return "auth"
    if any(isinstance(e, redis.exceptions.InvalidResponse) for e in chain):
        return "not_redis"
    if isinstance(exc, _BUSY):
        return "other"  # NOTE: Redis is there (loading its data, or out of client slots)
    connection = redis.ConnectionError | RedisClusterUnreachableError | ConnectionError
    return "unreachable" if any(isinstance(e, connection) for e in chain) else "other"


def _detail(exc: BaseException) -> str:
    """``exc``'s text, without the object reprs redis-py puts in some (a Sentinel's whole
    connection pool), at most ``DETAIL_CHARS`` characters."""
    text = str(exc)
    while (shorter := _REPR.sub("", text)) != text:
        text = shorter
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def ping_fault(client: redis.Redis, place: RedisPlace | None = None) -> RedisFault | None:
    """None when ``client`` answers a PING, else why not (``redis_fault``)."""
    try:
        client.ping()
    except REDIS_ERRORS as exc:
        return redis_fault(exc, place)
    return None
