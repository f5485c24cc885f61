"""store/index/redis/faults.py: a Redis that is too slow and a Redis that is not there are told
apart, each with its own advice; against real sockets (a port nothing listens on, and a listening
socket that never answers), no Redis needed."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
import redis

from store.guard import Guard
from store.index.redis.faults import RedisPlace, ping_fault, redis_fault
from store.stats import StatsRecorder
from tests.helpers import free_port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose socket accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=0.2, socket_connect_timeout=0.2)


def test_a_refused_connection_is_unreachable_with_the_advice_to_start_redis() -> None:
    """Nothing listens: ``unreachable``; the message names the URL, says nothing answers there,
    and advises starting Redis or setting --redis-url, never the timeout."""
    port = free_port()
    fault = ping_fault(client(port), RedisPlace(f"redis://127.0.0.1:{port}/0", 0.2))
    assert fault is not None and fault.kind == "unreachable"
    assert f"Redis at redis://127.0.0.1:{port}/0 is unreachable: nothing answers there" in fault.message
    assert "Connection refused" in fault.message
    assert "start Redis (redis-server) or set --redis-url (KVPROXY_REDIS_URL)" in fault.message
    assert "--redis-timeout" not in fault.message


def test_a_silent_server_is_a_timeout_with_the_advice_to_raise_the_timeout(silent_port) -> None:
    """A listener that never answers: ``timeout``; the message gives the timeout in seconds and
    advises raising --redis-timeout, never starting Redis."""
    fault = ping_fault(client(silent_port), RedisPlace(f"redis://127.0.0.1:{silent_port}/0", 0.2))
    assert fault is not None and fault.kind == "timeout"
    assert f"redis://127.0.0.1:{silent_port}/0 did not answer within --redis-timeout (0.2 s)" in fault.message
    assert "raise --redis-timeout (KVPROXY_REDIS_TIMEOUT)" in fault.message
    assert "start Redis" not in fault.message and "unreachable" not in fault.message


def test_refused_credentials_and_other_errors_have_advice_of_their_own() -> None:
    """Refused credentials point at the URL's user and password; an error Redis answered with is
    ``other``, naming it; a place without URL or timeout still reads whole."""
    auth = redis_fault(redis.AuthenticationError("invalid username-password pair"))
    assert auth.kind == "auth"
    assert auth.message.startswith("Redis refused the credentials (invalid username-password pair)")
    assert "check the user and password in --redis-url" in auth.message
    oom = redis_fault(redis.exceptions.OutOfMemoryError("OOM command not allowed"), RedisPlace("redis://r:1"))
    assert oom.kind == "other"
    assert str(oom) == (
        "Redis at redis://r:1 failed (OutOfMemoryError: OOM command not allowed): see the Redis server's log"
    )
    assert redis_fault(redis.TimeoutError("Timeout reading from socket")).message.startswith(
        "Redis did not answer within --redis-timeout: "
    )


def test_the_guard_warns_of_a_timeout_as_a_timeout(silent_port, caplog) -> None:
    """The cache's Guard, on a Redis call that times out: one warning naming the timeout and its
    advice, and that the server serves uncached meanwhile."""
    guard = Guard(60, StatsRecorder(), RedisPlace(f"redis://127.0.0.1:{silent_port}/0", 0.2))
    with caplog.at_level(logging.WARNING, logger="store"):
        assert guard.redis("lookup", client(silent_port).ping) is None
    [warning] = [r.getMessage() for r in caplog.records if "during lookup" in r.getMessage()]
    assert warning.startswith(
        f"Redis index failed during lookup: Redis at redis://127.0.0.1:{silent_port}/0 did not answer "
        "within --redis-timeout (0.2 s): it is overloaded, paused or far away; if it is merely slow, "
        "raise --redis-timeout (KVPROXY_REDIS_TIMEOUT). Serving uncached"
    )
