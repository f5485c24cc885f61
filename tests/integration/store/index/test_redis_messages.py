"""What an operator reads when Redis fails, on every path that says it (the serving cache's start,
its Guard while serving, ``kvproxy cache``, the router): a Redis paused by SIGSTOP (a timeout:
raise --redis-timeout) is never reported as one that is not there (start Redis or set
--redis-url), and the reverse; refused credentials point at the URL's password."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from proxy.cli import main
from proxy.config import state_place
from proxy.router.identity import Identity
from proxy.router.index import RouteIndex
from proxy.router.routing import Router
from proxy.router.settings import RouteSettings
from proxy.stores import open_admin, open_cache, open_responses
from store.index.redis.connect import redis_client
from store.index.redis.faults import redis_fault
from tests.helpers import SPEC, RedisServer, free_port

TIMEOUT = "did not answer within --redis-timeout (0.25 s): it is overloaded, paused or far away"
UNREACHABLE = "is unreachable: nothing answers there"
NOT_REDIS = "is not a Redis server: what answers there does not speak Redis's protocol"


@pytest.fixture
def paused() -> Iterator[RedisServer]:
    """A private redis-server that answers, then is stopped with SIGSTOP (it keeps its port and
    its connections, and answers nothing) until the test ends."""
    server = RedisServer(free_port()).start()
    try:
        yield server
    finally:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def pause(server: RedisServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.fixture
def http_port() -> Iterator[int]:
    """A port where an HTTP server answers whatever it is sent with a 400 (not Redis)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)

        def answer() -> None:
            with contextlib.suppress(OSError):
                while True:
                    connection, _ = listener.accept()
                    with connection:
                        connection.recv(4096)
                        connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        yield listener.getsockname()[1]


def test_a_paused_redis_at_start_is_a_timeout_and_a_missing_one_is_unreachable(
    settings, paused, http_port, caplog
) -> None:
    """The serving cache's start-up warning, one line (the counters, asked next, add none): for the
    paused Redis, the timeout and its advice; for a port nothing listens on, unreachable and the
    advice to start it; for an HTTP server, not Redis and the advice to check the address; never
    another's."""
    pause(paused)
    missing = f"redis://127.0.0.1:{free_port()}/0"
    http = f"redis://127.0.0.1:{http_port}/0"
    advice = {
        TIMEOUT: "raise --redis-timeout (KVPROXY_REDIS_TIMEOUT)",
        UNREACHABLE: "start Redis (redis-server) or set --redis-url (KVPROXY_REDIS_URL)",
        NOT_REDIS: "check the host and port in --redis-url (KVPROXY_REDIS_URL)",
    }
    for url, says in ((paused.url, TIMEOUT), (missing, UNREACHABLE), (http, NOT_REDIS)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            cache = open_cache(settings.model_copy(update={"redis_url": url, "redis_timeout": 0.25}), SPEC)
            assert cache.admin.deployment_stats() is None  # NOTE: the counters' own breaker: no second line
            cache.close()
        logged = warnings(caplog)
        assert logged.count("Redis at") == 1, logged
        assert f"Redis at {url} {says}" in logged, logged
        assert advice[says] in logged
        assert "Serving uncached; caching resumes on its own when Redis answers." in logged
        assert not any(other in logged for other in advice if other != says), logged


def test_redis_paused_while_serving_is_logged_as_a_timeout(settings, paused, caplog) -> None:
    """A cache whose Redis answered, then stops answering (paused): its Guard's warning says
    the Redis did not answer within the timeout, not that it is unreachable."""
    admin = open_admin(settings.model_copy(update={"redis_url": paused.url, "redis_timeout": 0.25}))
    assert admin.health() == "ok"
    pause(paused)
    with caplog.at_level(logging.WARNING, logger="store"):
        assert admin.health() == "degraded"
    logged = warnings(caplog)
    assert f"Redis index failed during ping: Redis at {paused.url} {TIMEOUT}" in logged, logged
    assert UNREACHABLE not in logged


def test_refused_credentials_are_reported_as_such(settings, caplog) -> None:
    """A Redis that requires a password, asked without one: the start-up warning points at the
    URL's user and password."""
    server = RedisServer(free_port()).start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", "s3cret")
        with caplog.at_level(logging.WARNING):
            open_cache(settings.model_copy(update={"redis_url": server.url}), SPEC).close()
    finally:
        server.stop()
    logged = warnings(caplog)
    assert f"Redis at {server.url} refused the credentials" in logged, logged
    assert "check the user and password in --redis-url (KVPROXY_REDIS_URL)" in logged


def test_kvproxy_cache_says_why_redis_did_not_answer(paused, tmp_path) -> None:
    """``kvproxy cache stats`` exits 1 with the timeout's advice for the paused Redis, and with
    the advice to start Redis for a port nothing listens on."""
    pause(paused)
    missing = f"redis://127.0.0.1:{free_port()}/0"
    for url, says in ((paused.url, TIMEOUT), (missing, UNREACHABLE)):
        args = ["cache", "stats", "--redis-url", url, "--redis-timeout", "0.25", "--cache-dir", str(tmp_path)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1
        assert f"kvproxy: Redis at {url} {says}" in result.output, result.output


async def probe_once(router: Router) -> None:
    await router.probe_all()
    await router.close()


def test_the_router_tells_a_paused_redis_from_a_missing_one(paused, caplog) -> None:
    """The router's shared index on the paused Redis: routing on local counts, logged as a
    timeout; on a port nothing listens on, as unreachable."""
    pause(paused)
    missing = f"redis://127.0.0.1:{free_port()}/0"
    for url, says in ((paused.url, TIMEOUT), (missing, UNREACHABLE)):
        settings = RouteSettings(
            upstream=f"http://127.0.0.1:{free_port()}/v1", redis_url=url, redis_timeout=0.25
        )
        index = RouteIndex(redis_client(url, 0.25), "t:", "router")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="route"):
            asyncio.run(probe_once(Router(settings, index, Identity(None))))
        assert f"Redis at {url} {says}" in warnings(caplog), warnings(caplog)
        assert "Routing on local counts until it answers." in warnings(caplog)


def test_stored_responses_name_their_own_timeout(settings, paused) -> None:
    """Stored responses wait longer than the cache (state, not cache): a paused Redis is reported
    with the timeout they waited, and where it comes from."""
    state = settings.model_copy(update={"redis_url": paused.url, "redis_timeout": 0.25})
    responses = open_responses(state)
    pause(paused)
    with pytest.raises(redis.TimeoutError) as raised:
        responses.get("tenant", "resp_1")
    fault = redis_fault(raised.value, state_place(state))
    assert fault.kind == "timeout"
    assert f"Redis at {paused.url} did not answer within --redis-timeout or 2 s if longer (2 s)" in str(fault)
