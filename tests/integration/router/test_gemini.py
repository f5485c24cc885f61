"""Gemini's API through ``kvproxy route`` with the official ``google-genai`` client, in front of
three tiny-model replicas, each with its own cache and named caches (key prefix, blob directory),
keyed per tenant: a named cache is created on one replica, used (whole and streamed) with hits
there, listed, read and deleted through the router, also through a second router on the same
Redis; another tenant can neither use nor see it; generation is routed by the prompt as the
replica renders it; the router's own errors are in Google's shape."""

from __future__ import annotations

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from hashing import BLOCK_SIZE
from tests.replicas import cluster, text

KEYS = "alice-key=alice,bob-key=bob"
DOCUMENT = text(7, 1250)  # about 2,000 tokens of the tiny tokenizer
QUESTION = "What is the document about?"


def gemini(server, key: str = "alice-key") -> genai.Client:
    options = types.HttpOptions(base_url=server.base_url, api_version="v1beta", timeout=120_000)
    return genai.Client(api_key=key, http_options=options)


def make(client: genai.Client, document: str = DOCUMENT) -> types.CachedContent:
    config = types.CreateCachedContentConfig(
        contents=[types.Content(role="user", parts=[types.Part(text=document)])],
        system_instruction="Answer from the document.",
        ttl="600s",
    )
    return client.caches.create(model="tiny", config=config)


def config(name: str | None = None) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(cached_content=name, max_output_tokens=8, temperature=0)


def holders(replicas, name: str, key: str = "alice-key") -> list[int]:
    """The replicas (by index) that hold the named cache ``name`` for ``key``'s tenant."""
    found = []
    for i, replica in enumerate(replicas):
        r = httpx.get(f"{replica.base_url}/v1beta/{name}", headers={"x-goog-api-key": key})
        found += [i] if r.status_code == 200 else []
    return found


@pytest.fixture
def routed(settings, tiny_model, tmp_path):
    keyed = settings.model_copy(update={"api_keys": KEYS})
    with cluster(keyed, tiny_model, tmp_path, routers=2) as (fronts, replicas):
        yield fronts, replicas


def test_a_named_cache_through_the_router_lives_on_one_replica_and_hits(routed) -> None:
    """Created through router 1 on one replica; used twice through it and once streamed through
    router 2 (which learns where it is from the shared index), each reading at least the cache's
    full blocks; listed and read through both; deleted through router 2: gone everywhere."""
    (front, second), replicas = routed
    client, other = gemini(front), gemini(second)  # NOTE: a client must outlive its streams
    cache = make(client)
    [home] = holders(replicas, cache.name)
    full_blocks = cache.usage_metadata.total_token_count // BLOCK_SIZE * BLOCK_SIZE
    answers = [client.models.generate_content(model="tiny", contents=QUESTION, config=config(cache.name))]
    answers.append(
        client.models.generate_content(model="tiny", contents="And then?", config=config(cache.name))
    )
    assert all(a.usage_metadata.cached_content_token_count >= full_blocks for a in answers)
    streamed = list(
        other.models.generate_content_stream(model="tiny", contents=QUESTION, config=config(cache.name))
    )
    assert "".join(chunk.text or "" for chunk in streamed) == answers[0].text
    assert streamed[-1].usage_metadata.cached_content_token_count >= full_blocks
    for each in (client, other):
        assert [c.name for c in each.caches.list()] == [cache.name]
        assert each.caches.get(name=cache.name).usage_metadata.total_token_count > 0
    assert holders(replicas, cache.name) == [home]
    other.caches.delete(name=cache.name)
    assert holders(replicas, cache.name) == []
    with pytest.raises(genai_errors.ClientError) as gone:
        client.models.generate_content(model="tiny", contents=QUESTION, config=config(cache.name))
    assert gone.value.code == 404 and gone.value.status == "NOT_FOUND"


def test_a_router_without_redis_remembers_its_named_caches_itself(settings, tiny_model, tmp_path) -> None:
    """A router on ``memory://`` (no shared index): the cache it made is used with hits on the
    replica holding it, then deleted there."""
    keyed = settings.model_copy(update={"api_keys": KEYS})
    with cluster(keyed, tiny_model, tmp_path, redis_url="memory://") as ([front], replicas):
        assert front.app.state.router.index is None
        client = gemini(front)
        cache = make(client)
        assert len(holders(replicas, cache.name)) == 1
        for question in (QUESTION, "And then?"):
            answer = client.models.generate_content(
                model="tiny", contents=question, config=config(cache.name)
            )
            assert answer.usage_metadata.cached_content_token_count >= BLOCK_SIZE
        client.caches.delete(name=cache.name)
        assert holders(replicas, cache.name) == []


def test_another_tenant_can_neither_use_nor_see_a_named_cache(routed) -> None:
    """Bob, through the router, gets 404s for Alice's cache (generate, countTokens, get, delete)
    and an empty listing, with ``x-goog-api-key``, ``?key=`` or the SDK; Alice's cache stays. A
    name that is no cache id is never looked up at a URL of its making: a 404."""
    (front, _), replicas = routed
    alice, bob = gemini(front), gemini(front, "bob-key")
    cache = make(alice)
    assert list(bob.caches.list()) == []
    for attempt in (
        lambda: bob.caches.get(name=cache.name),
        lambda: bob.caches.delete(name=cache.name),
        lambda: bob.models.generate_content(model="tiny", contents=QUESTION, config=config(cache.name)),
    ):
        with pytest.raises(genai_errors.ClientError) as refused:
            attempt()
        assert refused.value.code == 404 and refused.value.status == "NOT_FOUND"
    body = {"contents": [{"parts": [{"text": "hi"}]}], "cachedContent": cache.name}
    counted = httpx.post(f"{front.base_url}/v1beta/models/tiny:countTokens?key=bob-key", json=body)
    assert counted.status_code == 404 and counted.json()["error"]["status"] == "NOT_FOUND"
    odd = body | {"cachedContent": "cachedContents/../../v1/cache/stats"}  # NOTE: never a URL the router asks
    strange = httpx.post(f"{front.base_url}/v1beta/models/tiny:generateContent?key=alice-key", json=odd)
    assert strange.status_code == 404 and strange.json()["error"]["status"] == "NOT_FOUND"
    listed = httpx.get(f"{front.base_url}/v1beta/cachedContents", params={"key": "bob-key"})
    assert listed.status_code == 200 and listed.json() == {"cachedContents": []}
    assert len(holders(replicas, cache.name)) == 1
    assert alice.caches.get(name=cache.name).name == cache.name


def test_a_cache_made_behind_the_routers_back_is_found(routed) -> None:
    """A named cache created on replica 2 directly (no router saw it): a request through the router
    naming it goes there and reads it; a listing holds it with the one made through the router,
    paged by the router."""
    (front, _), replicas = routed
    direct = make(gemini(replicas[2]), document=text(9, 300))
    client = gemini(front)
    answer = client.models.generate_content(model="tiny", contents=QUESTION, config=config(direct.name))
    assert answer.usage_metadata.cached_content_token_count >= BLOCK_SIZE
    routed_cache = make(client)
    listed = [c.name for c in client.caches.list()]
    assert sorted(listed) == sorted([direct.name, routed_cache.name])
    first = httpx.get(
        f"{front.base_url}/v1beta/cachedContents?pageSize=1", headers={"x-goog-api-key": "alice-key"}
    )
    page = first.json()
    assert len(page["cachedContents"]) == 1 and page["nextPageToken"] == "1"


def test_gemini_prompts_route_like_the_other_dialects(routed, tiny_model) -> None:
    """The router hashes a Gemini body as the replica renders it (its prompt length); the same
    long prompt twice lands on one replica, the second time an ``affinity`` hit; a prompt starting
    with a named cache's content goes where the cache was made."""
    (front, _), replicas = routed
    identity = front.app.state.router.identity
    body = {
        "systemInstruction": {"parts": [{"text": "be kind"}]},
        "contents": [{"role": "user", "parts": [{"text": text(3, 700)}]}],
        "generationConfig": {"maxOutputTokens": 4, "temperature": 0},
    }
    url, key = f"{front.base_url}/v1beta/models/tiny:generateContent", {"x-goog-api-key": "alice-key"}
    seen, usages = [], []
    for _ in range(2):
        r = httpx.post(url, json=body, headers=key, timeout=120)
        assert r.status_code == 200, r.text
        seen.append((r.headers["x-kvproxy-replica"], r.headers["x-kvproxy-route"]))
        usages.append(r.json()["usageMetadata"])
    assert identity.prompt("gemini", body, "t", "tiny").prompt_tokens == usages[0]["promptTokenCount"]
    assert seen[0][0] == seen[1][0] and seen[1][1] == "affinity"
    assert usages[1]["cachedContentTokenCount"] >= BLOCK_SIZE
    cache = make(gemini(front), document=text(4, 700))
    [home] = holders(replicas, cache.name)
    follow = {
        "systemInstruction": {"parts": [{"text": "Answer from the document."}]},
        "contents": [
            {"role": "user", "parts": [{"text": text(4, 700)}]},
            {"role": "user", "parts": [{"text": QUESTION}]},
        ],
        "generationConfig": {"maxOutputTokens": 4, "temperature": 0},
    }
    r = httpx.post(url, json=follow, headers=key, timeout=120)
    assert r.headers["x-kvproxy-replica"] == f"{replicas[home].base_url}/v1"
    assert r.headers["x-kvproxy-route"] == "affinity"


def test_the_routers_own_errors_are_in_googles_shape(routed) -> None:
    """A body that is not JSON: the router's 400 in Google's shape; an unknown ``/v1beta`` route:
    a 404 in Google's shape listing the Gemini routes the router serves; the models listed are
    the replicas'."""
    (front, _), _ = routed
    bad = httpx.post(
        f"{front.base_url}/v1beta/models/tiny:generateContent",
        content=b"{",
        headers={"x-goog-api-key": "alice-key"},
    )
    assert bad.status_code == 400
    assert bad.json()["error"] == {
        "code": 400,
        "message": "the request body is not valid JSON",
        "status": "INVALID_ARGUMENT",
    }
    unknown = httpx.get(f"{front.base_url}/v1beta/files")
    error = unknown.json()["error"]
    assert unknown.status_code == 404 and error["status"] == "NOT_FOUND"
    for route in (
        "POST /v1beta/models/{model}:generateContent",
        "POST /v1beta/models/{model}:streamGenerateContent",
        "POST /v1beta/cachedContents",
        "DELETE /v1beta/cachedContents/{cache_id}",
    ):
        assert route in error["message"]
    client = gemini(front)
    assert [m.name for m in client.models.list()] == ["models/tiny"]
    assert client.models.get(model="tiny").name == "models/tiny"
