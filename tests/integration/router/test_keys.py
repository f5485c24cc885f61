"""``kvproxy route`` in front of two real ``kvproxy serve`` replicas started with API keys
(``ka=alice,kb=bob``), each serving its own model name: a router with the same keys lists their
models with its first key and routes by model; a router whose key they refuse says so once per
replica, and asks again only after a minute, however often it probes."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from proxy.router.app import create_route_app
from proxy.router.identity import Identity
from proxy.router.settings import RouteSettings
from tests.helpers import ServerThread, wait_for
from tests.replicas import replica_app, wait_until_all_up

KEYS = "ka=alice,kb=bob"
NAMES = ("alpha", "beta")
LISTED = re.compile(r'HTTP Request: GET (\S+)/v1/models "HTTP/1.1 (\d+)')
"""httpx's line for each of the router's probes of a replica's models: (replica root, status)."""
HEALTH = re.compile(r'HTTP Request: GET (\S+)/health "HTTP/1.1 200')
"""httpx's line for each of the router's health probes of a replica that answered."""


@pytest.fixture
def replicas(settings, tiny_model, tmp_path) -> Iterator[list[ServerThread]]:
    """Two replicas on the tiny model, keyed ``KEYS``, serving it as ``alpha`` and ``beta``."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                ServerThread(
                    replica_app(
                        settings.model_copy(update={"api_keys": KEYS, "served_model_name": name}),
                        tiny_model,
                        i,
                        tmp_path,
                    )
                )
            )
            for i, name in enumerate(NAMES)
        ]


@contextmanager
def router(settings, replicas, api_keys: str | None) -> Iterator[ServerThread]:
    """A router with ``api_keys`` in front of ``replicas``, probing them every 0.2 s."""
    route = RouteSettings(
        upstream=",".join(f"{r.base_url}/v1" for r in replicas),
        redis_url=settings.redis_url,
        key_prefix=f"{settings.key_prefix}route:",
        health_interval=0.2,
        api_keys=api_keys,
    )
    with ServerThread(create_route_app(route, Identity(None))) as front:
        wait_until_all_up(front)
        yield front


def listings(caplog) -> Counter[tuple[str, str]]:
    """How many times the router asked each replica for its models, by status."""
    return Counter(
        m.groups() for r in caplog.records if r.name == "httpx" and (m := LISTED.search(r.getMessage()))
    )


def refusals(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "route" and "refuses to list" in r.getMessage()
    ]


def test_a_router_with_the_replicas_keys_learns_their_models_and_routes_by_them(
    settings, replicas, caplog
) -> None:
    """Same ``--api-keys`` as the replicas: every probe's listing answers 200 (no 401), the router
    knows ``alpha`` on replica 0 and ``beta`` on replica 1, and a request naming each model (with
    bob's key) goes to the replica serving it, three times out of three."""
    caplog.set_level(logging.INFO, logger="httpx")
    with router(settings, replicas, KEYS) as front:
        known = front.app.state.router.replicas.all
        wait_for(lambda: [r.models for r in known] == [{"alpha"}, {"beta"}], what="both replicas' models")
        served = []
        for name in NAMES * 3:
            body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            answer = httpx.post(
                f"{front.base_url}/v1/chat/completions",
                json=body,
                headers={"Authorization": "Bearer kb"},
                timeout=120,
            )
            assert answer.status_code == 200, answer.text
            served.append((name, answer.headers["x-kvproxy-replica"]))
    urls = [f"{r.base_url}/v1" for r in replicas]
    assert served == [("alpha", urls[0]), ("beta", urls[1])] * 3
    assert {status for _, status in listings(caplog)} == {"200"}
    assert refusals(caplog) == []


@pytest.mark.parametrize(("api_keys", "sent"), [("kc=carol", "its first --api-keys key"), (None, "no key")])
def test_a_router_the_replicas_refuse_warns_once_per_replica(
    settings, replicas, caplog, api_keys, sent
) -> None:
    """A key the replicas do not take (or none): one warning per replica, naming it, the 401 and
    KVPROXY_API_KEYS; over the next five health probes of each, no listing asked again (one 401 in
    each replica's log, not one per probe); the router knows no models."""
    caplog.set_level(logging.INFO, logger="httpx")
    roots = [r.base_url for r in replicas]

    def probed(root: str) -> int:
        lines = (HEALTH.search(r.getMessage()) for r in caplog.records if r.name == "httpx")
        return sum(1 for m in lines if m is not None and m.group(1) == root)

    with router(settings, replicas, api_keys) as front:
        wait_for(
            lambda: all(listings(caplog)[(root, "401")] for root in roots), what="a refused listing of each"
        )
        since = {root: probed(root) for root in roots}
        wait_for(
            lambda: all(probed(root) >= since[root] + 5 for root in roots), what="five more health probes"
        )
        models = [r.models for r in front.app.state.router.replicas.all]
    assert all(listings(caplog)[(root, "401")] == 1 for root in roots), listings(caplog)
    warned = refusals(caplog)
    assert models == [set(), set()]
    assert sorted(w.split()[1] for w in warned) == sorted(f"{root}/v1" for root in roots), warned
    assert all("401 Unauthorized" in w and sent in w and "KVPROXY_API_KEYS" in w for w in warned), warned
