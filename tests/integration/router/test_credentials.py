"""Credentials through ``kvproxy route`` and into ``kvproxy serve`` (real HTTP): the client's own key
reaches the replica unchanged, an ``--upstream`` carrying a user and password is refused at
start-up, a request carrying two different keys (in any of the places one comes: Authorization,
x-api-key, x-goog-api-key, Gemini's ``?key=``, or one header twice) is refused in the dialect's
shape by both, and a client leaving a non-streamed request through the router stops the replica."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest
from pydantic import ValidationError

from proxy.router.settings import RouteSettings
from tests.helpers import wait_for
from tests.replicas import routed

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

CONFLICTS = [
    # (path, body, headers, query, where the second key came from)
    (
        "/v1/chat/completions",
        CHAT,
        [("authorization", "Bearer ka"), ("authorization", "Bearer kb")],
        "",
        "authorization",
    ),
    ("/v1/chat/completions", CHAT, [("authorization", "Bearer ka"), ("x-api-key", "kb")], "", "x-api-key"),
    ("/v1/messages", MESSAGES, [("x-api-key", "ka"), ("x-api-key", "kb")], "", "x-api-key"),
    ("/v1/messages", MESSAGES, [("x-api-key", "ka"), ("authorization", "Bearer kb")], "", "x-api-key"),
    ("/v1beta/models/{m}:generateContent", GEMINI, [("x-goog-api-key", "ka")], "?key=kb", "key"),
    ("/v1beta/models/{m}:generateContent", GEMINI, [], "?key=ka&key=kb", "key"),
    (
        "/v1beta/models/{m}:generateContent",
        GEMINI,
        [("x-goog-api-key", "ka"), ("x-goog-api-key", "kb")],
        "",
        "x-goog-api-key",
    ),
]


def refused_in_dialect(r: httpx.Response, path: str, where: str) -> None:
    """A 400 in the route's dialect naming where the second key came from."""
    assert r.status_code == 400, r.text
    doc = r.json()
    if path.startswith("/v1/messages"):
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error", doc
        assert where in doc["error"]["message"], doc
    elif path.startswith("/v1beta/"):
        assert doc["error"]["status"] == "INVALID_ARGUMENT" and where in doc["error"]["message"], doc
    else:
        assert doc["error"]["code"] == "conflicting_api_keys" and doc["error"]["param"] == where, doc


def test_an_upstream_carrying_a_user_and_password_is_refused_at_start_up() -> None:
    """A user or password in --upstream would replace every client's own key at the replica (one
    tenant there): the settings and the real command refuse it, naming the URL without its
    password."""
    for url in ("http://user:hunter2-pw@127.0.0.1:1/v1", "http://hunter2-pw@127.0.0.1:1/v1"):
        with pytest.raises(ValidationError, match="carries a user or password"):
            RouteSettings(upstream=f"http://127.0.0.1:2/v1,{url}")
    urls = ("http://user:hunter2-pw@127.0.0.1:1/v1", "http://user%3Ahunter2-pw@127.0.0.1:1/v1")
    for url in (*urls, "http://hunter2-pw:@127.0.0.1:1/v1"):
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "route", "--upstream", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "carries a user or password" in done.stderr, done.stderr
        assert "hunter2-pw" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1:18501/v1",
        "http://127.0.0.1:99999/v1",
        "http://127.0.0.1:0/v1",
        "http://h:x/v1",
        "http://:80/v1",
        "http://h:1/x#/v1",
        "http://h:1/v1?a=/v1",
    ],
)
def test_an_upstream_that_does_not_parse_is_a_usage_error(url) -> None:
    """A host or port no URL has (an IPv6 host not closed, a port past 65535 or 0) is refused at
    start as any malformed --upstream is: a usage error naming it, no traceback."""
    with pytest.raises(ValidationError, match="is not an OpenAI base URL"):
        RouteSettings(upstream=url)


def test_the_clients_own_key_reaches_the_replica_unchanged(key_prefix) -> None:
    """Whatever header the client's key comes in reaches the replica as it was sent; the same key
    in two places is one key, and passes."""
    with routed(key_prefix, names=("a",)) as (router, up):
        sent = [
            {"Authorization": "Bearer alice-key"},
            {"x-api-key": "bob-key"},
            {"Authorization": "Bearer carol-key", "x-api-key": "carol-key"},
        ]
        for headers in sent:
            r = httpx.post(f"{router.base_url}/v1/chat/completions", json=CHAT, headers=headers, timeout=30)
            assert r.status_code == 200, r.text
        got = [h for _, h in up["a"].app.state.bodies]
    for headers, received in zip(sent, got, strict=True):
        assert {k.lower(): v for k, v in headers.items()}.items() <= received.items(), received


@pytest.mark.parametrize(("path", "body", "headers", "query", "where"), CONFLICTS)
def test_two_different_keys_are_refused_by_the_router(key_prefix, path, body, headers, query, where) -> None:
    """The router keys the route on one key and the replica may read another: refused (400 in the
    dialect's shape) before anything reaches a replica."""
    with routed(key_prefix, names=("a",)) as (router, up):
        url = f"{router.base_url}{path.format(m='fake')}{query}"
        r = httpx.post(url, json=body, headers=headers, timeout=30)
        refused_in_dialect(r, path, where)
        assert up["a"].app.state.bodies == []


@pytest.mark.parametrize("api_keys", [None, "ka=alice,kb=bob"])
@pytest.mark.parametrize(("path", "body", "headers", "query", "where"), CONFLICTS)
def test_two_different_keys_are_refused_by_the_server(
    settings, tiny_model, serve, api_keys, path, body, headers, query, where
) -> None:
    """``kvproxy serve`` refuses them too, with API keys (both valid) or without any."""
    body = {**body, "model": "tiny"} if "model" in body else body
    with serve(settings.model_copy(update={"api_keys": api_keys}), tiny_model) as server:
        url = f"{server.base_url}{path.format(m='tiny')}{query}"
        refused_in_dialect(httpx.post(url, json=body, headers=headers, timeout=60), path, where)
        same = [(name, value.replace("kb", "ka")) for name, value in headers]
        agreed = httpx.post(url.replace("kb", "ka"), json=body, headers=same, timeout=60)
        assert agreed.status_code == 200, agreed.text


def test_a_client_leaving_a_non_streamed_request_through_the_router_stops_the_replica(key_prefix) -> None:
    """The replica (slow to answer, ending when its client leaves) sees the router's connection
    close when the router's client leaves, long before it would have answered."""
    with routed(key_prefix, names=("a",), first_byte_timeout=300.0) as (router, up):
        state = up["a"].app.state
        state.mode, state.delay_s = "slow", 120.0
        raw = json.dumps(CHAT).encode()
        client = socket.create_connection(("127.0.0.1", router.port))
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n"
        )
        client.sendall(head.encode() + raw)
        wait_for(lambda: state.bodies, 60, "the request to reach the replica")
        left = time.monotonic()
        client.close()
        wait_for(lambda: state.left, 60, "the replica to see its client leave")
    assert state.left[0] - left < state.delay_s / 2
