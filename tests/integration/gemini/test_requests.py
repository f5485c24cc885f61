"""Gemini's routes field by field (the lifecycle of named caches is ``named/test_caches.py``):
what they refuse by name, the expiry a named cache gets, the block fields kvproxy adds to its usage,
and the routes that refuse to be named a cache rather than ignore it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from hashing import BLOCK_SIZE
from tests.api import Api
from tests.replicas import text

DOCUMENT = text(3, 400)  # about 650 tokens of the tiny tokenizer: 5 full blocks


def generate(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1beta/models/tiny:generateContent", json=body, timeout=120)


def create(server, **fields) -> dict:
    body = {"model": "models/tiny", "contents": [{"role": "user", "parts": [{"text": DOCUMENT}]}]} | fields
    r = httpx.post(f"{server.base_url}/v1beta/cachedContents", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def lifetime_s(cache: dict) -> float:
    expires = datetime.fromisoformat(cache["expireTime"].replace("Z", "+00:00"))
    return (expires - datetime.fromisoformat(cache["createTime"].replace("Z", "+00:00"))).total_seconds()


@pytest.fixture
def server(settings, tiny_model, serve):
    with serve(settings.model_copy(update={"max_ttl": 7200}), tiny_model) as running:
        yield running


@pytest.mark.parametrize(
    "field",
    [
        {"generationConfig": {"topK": 5}},
        {"generationConfig": {"responseSchema": {"type": "STRING"}}},
        {"tools": [{"functionDeclarations": [{"name": "f"}]}]},
    ],
    ids=["topK", "responseSchema", "tools"],
)
def test_what_gemini_routes_cannot_honour_is_refused_by_name(server, field) -> None:
    """top-k, a response schema, tools: 400 INVALID_ARGUMENT in Google's shape, naming the field."""
    body = {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 4}}
    r = generate(server, body | field)
    name = next(iter(field))
    named = name if name == "tools" else f"generationConfig.{next(iter(field[name]))}"
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert f"`{named}`" in r.json()["error"]["message"]


def test_a_named_cache_lives_an_hour_by_default_capped_by_max_ttl(server) -> None:
    """No ttl: an hour; a ttl over --max-ttl (7,200 s): --max-ttl; an expireTime: that time."""
    assert lifetime_s(create(server)) == pytest.approx(3600, abs=1)
    assert lifetime_s(create(server, ttl="10000s")) == pytest.approx(7200, abs=1)
    at = datetime.now(UTC) + timedelta(seconds=900)
    asked = create(server, expireTime=at.isoformat().replace("+00:00", "Z"))
    assert datetime.fromisoformat(asked["expireTime"].replace("Z", "+00:00")) == pytest.approx(
        at, abs=timedelta(seconds=1)
    )


def test_a_named_cache_reports_the_blocks_it_pins(server) -> None:
    """usageMetadata.cachedBlockTokens is its full blocks' tokens (the tail is computed by each
    request), cachedBlockBytes their bytes: what /stats counts as pinned."""
    usage = create(server)["usageMetadata"]
    assert usage["cachedBlockTokens"] == usage["totalTokenCount"] // BLOCK_SIZE * BLOCK_SIZE > 0
    stats = httpx.get(f"{server.base_url}/stats", timeout=30).json()
    assert usage["cachedBlockBytes"] == stats["deployment"]["pinned_bytes"] > 0


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 4}),
        ("/tokenize", {"model": "tiny", "prompt": "hi"}),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4}),
    ],
)
def test_routes_that_cannot_read_a_named_cache_refuse_it(server, route, body) -> None:
    """A cached_content on a route whose prompt cannot start with it: 400 naming the field."""
    name = create(server)["name"]
    r = httpx.post(f"{server.base_url}{route}", json=body | {"cached_content": name}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cached_content", r.text


def test_a_system_instruction_is_reused_to_its_end_as_the_chat_route_reuses_a_system_prompt(server) -> None:
    """Two conversations with one system instruction: the second reads it to its last token (a tail
    is stored where it ends, as every dialect's turn stores one), not only to its last full block."""
    system = {"parts": [{"text": text(7, 200)}]}

    def ask(question: str) -> dict:
        body = {"systemInstruction": system, "contents": [{"role": "user", "parts": [{"text": question}]}]}
        r = generate(server, body | {"generationConfig": {"maxOutputTokens": 2, "temperature": 0}})
        assert r.status_code == 200, r.text
        return r.json()["usageMetadata"]

    ask("Name a colour.")
    Api(server).flush()
    head = {"model": "tiny", "messages": [{"role": "system", "content": system["parts"][0]["text"]}]}
    r = httpx.post(f"{server.base_url}/tokenize", json=head | {"add_generation_prompt": False}, timeout=60)
    ends = r.json()["count"]
    assert ends % BLOCK_SIZE and ends > BLOCK_SIZE  # NOTE: the system's end is inside a block
    # NOTE: and what the first conversation's tail shares with the second after it ("user",
    # "Name a"): a tail serves the tokens a prompt shares with it
    prompts = [
        httpx.post(f"{server.base_url}/tokenize", json=head | {"messages": [*head["messages"], q]}).json()
        for q in ({"role": "user", "content": "Name a colour."}, {"role": "user", "content": "Name a fruit."})
    ]
    a, b = (p["tokens"] for p in prompts)
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert shared > ends and ask("Name a fruit.")["cachedContentTokenCount"] == shared
