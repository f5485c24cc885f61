"""Budgets tenants share, on a real server, Redis and the tiny model: each tenant holds at most its
share (``--tenant-share``), so one tenant's traffic never evicts or refuses another's, no refusal
tells one tenant what another holds, a stored response echoes no field past its bound, and the
router keeps a digest of ``prompt_cache_key``, never the key."""

from __future__ import annotations

import re
import time
from contextlib import ExitStack, contextmanager

import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from openai import OpenAI

from proxy.router.app import create_route_app
from proxy.router.settings import RouteSettings
from tests.conftest import shared_redis_url
from tests.fake_upstream import fake_upstream
from tests.helpers import ServerThread
from tests.replicas import text

KEYS = "key-a=alice,key-b=bob"
GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 4}


def client(server, key: str) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def gemini(server, key: str) -> genai.Client:
    options = types.HttpOptions(base_url=server.base_url, api_version="v1beta", timeout=120_000)
    return genai.Client(api_key=key, http_options=options)


@contextmanager
def routed(key_prefix: str):
    """Two fake upstreams behind a router on the tests' Redis; yields the router."""
    with ExitStack() as stack:
        upstreams = [stack.enter_context(ServerThread(fake_upstream(n))) for n in ("a", "b")]
        settings = RouteSettings(
            upstream=",".join(f"{u.base_url}/v1" for u in upstreams),
            redis_url=shared_redis_url(),
            key_prefix=key_prefix,
            health_interval=0.2,
        )
        yield stack.enter_context(ServerThread(create_route_app(settings)))


def test_one_tenants_responses_never_evict_anothers(settings, tiny_model, serve) -> None:
    """Tenant A stores twenty responses into a budget five of them fill; tenant B's one stored
    response is still there, A's newest too, and A's oldest went (A evicted its own)."""
    keyed = settings.model_copy(update={"api_keys": KEYS, "responses_max_bytes": 20_000})
    with serve(keyed, tiny_model) as server:
        kept = client(server, "key-b").responses.create(**GREEDY, input="bob's question " * 20)
        a = [
            client(server, "key-a").responses.create(**GREEDY, input=f"alice {i} " * 40).id for i in range(20)
        ]
        assert client(server, "key-b").responses.retrieve(kept.id).id == kept.id
        assert client(server, "key-a").responses.retrieve(a[-1]).id == a[-1]
        with pytest.raises(openai.NotFoundError, match="expired or was evicted"):
            client(server, "key-a").responses.retrieve(a[0])


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("user", "u" * 100_000, "user"),
        ("text", {"format": {"type": "text"}, "notes": "n" * 100_000}, "text"),
        ("text", {"format": {"type": "text", "extra": ["e" * 1000] * 100}}, "text"),
        ("tool_choice", "auto" + " " * 100_000, "tool_choice"),
        ("tool_choice", {"type": "function", "name": "f", "why": "w" * 100_000}, "tool_choice"),
        ("input", [{"role": "user", "content": "hi", "id": "i" * 100_000}], "input[0].id"),
    ],
)
def test_an_echoed_field_past_its_bound_is_refused(settings, tiny_model, serve, field, value, param) -> None:
    """A field a stored response echoes, past its bound (as ``metadata``'s are bounded), is a 400
    naming it, and nothing is stored."""
    keyed = settings.model_copy(update={"api_keys": KEYS})
    with serve(keyed, tiny_model) as server:
        tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
        body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, "tools": [tool]} | {field: value}
        answer = httpx.post(
            f"{server.base_url}/v1/responses",
            json=body,
            headers={"Authorization": "Bearer key-a"},
            timeout=60,
        )
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["error"]["param"] == param
        assert len(answer.content) < 2000


def test_a_stored_response_echoes_only_what_it_read(settings, tiny_model, serve) -> None:
    """A function tool's fields beyond its own (``type``, ``name``, ``description``,
    ``parameters``, ``strict``) are not echoed: the stored response stays small."""
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "junk": "j" * 200_000}
    with serve(settings, tiny_model) as server:
        made = httpx.post(
            f"{server.base_url}/v1/responses",
            json={
                "model": "tiny",
                "input": "hi",
                "max_output_tokens": 2,
                "tools": [tool],
                "tool_choice": "none",
            },
            timeout=60,
        )
        assert made.status_code == 200, made.text[:300]
        stored = httpx.get(f"{server.base_url}/v1/responses/{made.json()['id']}", timeout=60)
        assert stored.json()["tools"] == [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
        assert len(stored.content) < 10_000


def make(client: genai.Client, seed: int, words: int = 190) -> types.CachedContent:
    """A named cache of ``words`` words (190: about 300 tokens of the tiny tokenizer, two blocks)."""
    config = types.CreateCachedContentConfig(
        contents=[types.Content(role="user", parts=[types.Part(text=text(seed, words))])], ttl="600s"
    )
    return client.caches.create(model="tiny", config=config)


def pinned(server) -> int:
    doc = httpx.get(f"{server.base_url}/stats", headers={"Authorization": "Bearer admin"}, timeout=60)
    return doc.json()["deployment"]["pinned_bytes"]


def test_a_tenant_past_its_pinned_share_gets_429_and_others_still_create(settings, tiny_model, serve) -> None:
    """``--max-pinned-bytes`` of twelve blocks, a quarter each: C makes a cache of three blocks, A
    one of two; A's second is a 429 that tells A its own figures only (not C's, nor the total),
    and B still makes one."""
    block = tiny_model.kv_spec.block_bytes
    budget = 4 * (3 * block)  # NOTE: a share holds one cache of two or three blocks, never two
    update = {"api_keys": KEYS + ",key-c=carol", "admin_key": "admin", "max_pinned_bytes": budget}
    with serve(settings.model_copy(update=update), tiny_model) as server:
        make(gemini(server, "key-c"), 1, words=280)
        carols = pinned(server)
        make(gemini(server, "key-a"), 2)
        held = pinned(server)
        with pytest.raises(genai_errors.APIError) as refused:
            make(gemini(server, "key-a"), 3)
        message = refused.value.message
        assert refused.value.code == 429 and "share" in message and "max-pinned-bytes" in message
        figures = {int(n) for n in re.findall(r"\d+", message)}
        assert carols not in figures and held not in figures, message
        assert figures == {budget // 4, held - carols, 2 * block}, message
        make(gemini(server, "key-b"), 4)
        assert pinned(server) > held


def test_a_full_pinned_budget_says_nothing_of_what_others_pin(settings, tiny_model, serve) -> None:
    """With ``--tenant-share 1`` B may fill the whole budget; A's cache is then a 429 that names the
    budget and no figure."""
    block = tiny_model.kv_spec.block_bytes
    update = {"api_keys": KEYS, "admin_key": "admin", "max_pinned_bytes": 3 * block, "tenant_share": 1.0}
    with serve(settings.model_copy(update=update), tiny_model) as server:
        make(gemini(server, "key-b"), 1)
        with pytest.raises(genai_errors.APIError) as refused:
            make(gemini(server, "key-a"), 2)
        assert refused.value.code == 429 and "max-pinned-bytes" in refused.value.message
        assert re.search(r"\d", refused.value.message) is None, refused.value.message


def test_the_router_keeps_a_digest_of_prompt_cache_key(key_prefix, redis_client) -> None:
    """A 300 kB ``prompt_cache_key`` is kept as 32 hex digits, in Redis and in the router's memory,
    and its requests still go to one replica."""
    cache_key = "k" * 300_000
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": cache_key}
    with routed(key_prefix) as router:
        replicas = set()
        for _ in range(3):
            answer = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, timeout=30)
            assert answer.status_code == 200
            replicas.add(answer.headers["x-kvproxy-replica"])
            time.sleep(0.3)  # NOTE: remembered in the background
        keys = [k.decode() for k in redis_client.scan_iter(match=f"{key_prefix}*", count=1000)]
        remembered = [k for k in keys if "prompt_cache_key:" in k]
        memory = list(router.app.state.router.responses)
    assert len(replicas) == 1
    assert len(remembered) == 1 and re.fullmatch(r".*:prompt_cache_key:[0-9a-f]{32}", remembered[0])
    assert all(len(k) < 200 for k in keys)
    assert [len(i) for _, i in memory] == [len("prompt_cache_key:") + 32]
