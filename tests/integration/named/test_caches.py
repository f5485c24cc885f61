"""Named caches (Gemini's ``cachedContents``) on a real server, Redis and the tiny model, through
the official clients: ``google-genai`` makes, lists, updates and deletes them and generates with
one; the ``openai`` and ``anthropic`` SDKs name one with the ``cached_content`` extension field.
A named cache's blocks are pinned: a run of unrelated requests that overflows ``--max-cache-bytes``
evicts everything else and none of them."""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from hashing import BLOCK_SIZE
from tests.helpers import HANG_S, wait_for
from tests.replicas import text

KEYS = "alice-key=alice,bob-key=bob"
DOCUMENT = text(7, 1250)  # about 2,000 tokens of the tiny tokenizer


def gemini(server, key: str = "alice-key") -> genai.Client:
    options = types.HttpOptions(base_url=server.base_url, api_version="v1beta", timeout=120_000)
    return genai.Client(api_key=key, http_options=options)


def stats(server, key: str = "admin") -> dict:
    return httpx.get(
        f"{server.base_url}/stats", headers={"Authorization": f"Bearer {key}"}, timeout=60
    ).json()


def make(client: genai.Client, ttl: str = "600s", document: str = DOCUMENT) -> types.CachedContent:
    config = types.CreateCachedContentConfig(
        contents=[types.Content(role="user", parts=[types.Part(text=document)])],
        system_instruction="Answer from the document.",
        ttl=ttl,
        display_name="the document",
    )
    return client.caches.create(model="tiny", config=config)


def ask(client: genai.Client, name: str | None, question: str, **contents) -> types.GenerateContentResponse:
    config = types.GenerateContentConfig(cached_content=name, max_output_tokens=8, temperature=0, **contents)
    return client.models.generate_content(model="tiny", contents=question, config=config)


@pytest.fixture
def server(settings, tiny_model, serve):
    keyed = settings.model_copy(update={"api_keys": KEYS, "admin_key": "admin"})
    with serve(keyed, tiny_model) as running:
        yield running


def test_a_named_cache_outlives_an_overflowing_run_and_serves_every_dialect(
    settings, tiny_model, serve
) -> None:
    """A 2,000-token document cached for 10 minutes; 12 unrelated prompts of 3 blocks each
    overflow a budget of 10 blocks: the first ones are evicted, the document's blocks all stay,
    and it is read from the cache by Gemini's, OpenAI's and Anthropic's clients, each answering
    as a cold server answers the same prompt."""
    probe = settings.model_copy(update={"api_keys": KEYS, "admin_key": "admin"})
    with serve(probe, tiny_model) as running:  # NOTE: one block's bytes, for the budget
        blocks = make(gemini(running)).usage_metadata.total_token_count // BLOCK_SIZE
        document_bytes = stats(running)["deployment"]["pinned_bytes"]
    block_bytes = document_bytes // blocks
    budget = 10 * block_bytes
    keyed = settings.model_copy(
        update={
            "api_keys": KEYS,
            "admin_key": "admin",
            "max_cache_bytes": budget,
            "no_render_ahead": True,  # NOTE: no next-turn blocks stored behind the test's back
            "key_prefix": settings.key_prefix + "b:",
        }
    )
    with serve(keyed, tiny_model) as server:
        client = gemini(server)
        before = time.time()
        cache = make(client)
        tokens = cache.usage_metadata.total_token_count
        assert 1900 <= tokens <= 2300, tokens
        assert before + 600 - 1 <= cache.expire_time.timestamp() <= time.time() + 600 + 1  # 1 s: rounding
        pinned = stats(server)["deployment"]["pinned_bytes"]
        assert pinned == document_bytes > budget

        chat = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="alice-key", max_retries=0)
        unrelated = [[{"role": "user", "content": text(100 + i, 250)}] for i in range(12)]
        for messages in unrelated:
            chat.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
        # NOTE: the writer stores, evicts and counts after each answer, in the background
        wait_for(lambda: stats(server)["deployment"].get("evicted_budget"), what="an eviction")
        assert server.app.state.engine.flush_saves(HANG_S)
        deployment = stats(server)["deployment"]
        assert deployment["bytes"] - deployment["pinned_bytes"] <= budget + 3 * block_bytes
        first = chat.chat.completions.create(model="tiny", messages=unrelated[0], max_tokens=1)
        assert first.usage.prompt_tokens_details.cached_tokens == 0  # evicted

        full_blocks = tokens // BLOCK_SIZE * BLOCK_SIZE
        answer = ask(client, cache.name, "What is the document about?")
        assert answer.usage_metadata.cached_content_token_count >= full_blocks
        question = [{"role": "user", "content": "What is the document about?"}]
        via_openai = chat.chat.completions.create(
            model="tiny",
            messages=question,
            max_tokens=8,
            temperature=0,
            extra_body={"cached_content": cache.name},
        )
        assert via_openai.usage.prompt_tokens_details.cached_tokens >= full_blocks
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="alice-key", max_retries=0)
        via_anthropic = claude.messages.create(
            model="tiny",
            max_tokens=8,
            messages=question,
            extra_body={"cached_content": cache.name, "temperature": 0},  # NOTE: the SDK dropped the argument
        )
        assert via_anthropic.usage.cache_read_input_tokens >= full_blocks
        count = claude.messages.count_tokens(
            model="tiny", messages=question, extra_body={"cached_content": cache.name}
        )
        read = via_anthropic.usage  # NOTE: Anthropic's prompt is input + cache creation + cache read
        assert (
            count.input_tokens
            == read.input_tokens + read.cache_creation_input_tokens + read.cache_read_input_tokens
        )
        assert via_openai.choices[0].message.content == answer.text == via_anthropic.content[0].text

    cold = settings.model_copy(update={"no_cache": True, "key_prefix": settings.key_prefix + "c:"})
    with serve(cold, tiny_model) as server:
        client = gemini(server)
        alone = ask(
            client,
            None,
            "What is the document about?",
            system_instruction="Answer from the document.",
        )
        contents = [
            types.Content(role="user", parts=[types.Part(text=DOCUMENT)]),
            "What is the document about?",
        ]
        config = types.GenerateContentConfig(
            max_output_tokens=8, temperature=0, system_instruction="Answer from the document."
        )
        cold_answer = client.models.generate_content(model="tiny", contents=contents, config=config)
        assert cold_answer.text == answer.text
        assert alone.usage_metadata.prompt_token_count < tokens


def test_a_named_cache_is_its_tenants_alone(server) -> None:
    """Listed, read, used (streamed as whole) and deleted by its tenant only: another tenant gets
    404s; deleted, its blocks are no longer pinned."""
    alice, bob = gemini(server), gemini(server, "bob-key")
    cache = make(alice)
    assert [c.name for c in alice.caches.list()] == [cache.name]
    assert alice.caches.get(name=cache.name).display_name == "the document"
    assert list(bob.caches.list()) == []
    for attempt in (
        lambda: bob.caches.get(name=cache.name),
        lambda: bob.caches.delete(name=cache.name),
        lambda: ask(bob, cache.name, "hi"),
    ):
        with pytest.raises(genai_errors.ClientError) as refused:
            attempt()
        assert refused.value.code == 404 and refused.value.status == "NOT_FOUND"
    chat = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="bob-key", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        chat.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"cached_content": cache.name},
        )
    assert stats(server)["deployment"]["pinned_bytes"] > 0
    config = types.GenerateContentConfig(cached_content=cache.name, max_output_tokens=8, temperature=0)
    streamed = list(alice.models.generate_content_stream(model="tiny", contents="hi", config=config))
    assert "".join(chunk.text or "" for chunk in streamed) == ask(alice, cache.name, "hi").text
    assert streamed[-1].candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert streamed[-1].usage_metadata.cached_content_token_count >= BLOCK_SIZE
    alice.caches.delete(name=cache.name)
    assert list(alice.caches.list()) == []
    assert stats(server)["deployment"]["pinned_bytes"] == 0
    with pytest.raises(genai_errors.ClientError):
        alice.caches.get(name=cache.name)


def test_a_named_cache_expires_at_its_time_and_can_be_kept_longer(server) -> None:
    """A 10-second cache is gone after its expiry (listing, reading and using it), and its pins
    with it, back to the other's; the other, given 10 minutes more by ``update`` within its own 10
    seconds, stays.

    NOTE: 10 s, not less: each cache must still be alive at the request after its creation (the
    update, the read of the pinned bytes), however slow the machine."""
    client = gemini(server)
    kept = make(client, ttl="10s", document=text(8, 200))
    before = time.time()
    updated = client.caches.update(name=kept.name, config=types.UpdateCachedContentConfig(ttl="600s"))
    assert before + 600 - 1 <= updated.expire_time.timestamp() <= time.time() + 600 + 1  # 1 s: rounding
    kept_alone = stats(server)["deployment"]["pinned_bytes"]
    short = make(client, ttl="10s")
    pinned = stats(server)["deployment"]["pinned_bytes"]
    assert 0 < kept_alone < pinned
    ends = max(kept.expire_time.timestamp(), short.expire_time.timestamp())  # the first expiries
    wait_for(lambda: time.time() > ends, what="both caches' first expiry")
    assert [c.name for c in client.caches.list()] == [kept.name]
    with pytest.raises(genai_errors.ClientError):
        ask(client, short.name, "hi")
    # NOTE: the sweep releases an expired cache's pins in the background, once a second
    wait_for(lambda: stats(server)["deployment"]["pinned_bytes"] == kept_alone, what="the sweep")
    assert ask(client, kept.name, "hi").usage_metadata.cached_content_token_count >= BLOCK_SIZE


def test_a_ttl_counts_from_when_the_cache_exists(server) -> None:
    """A TTL runs from the cache's creation, however long its content took to compute;
    ``countTokens`` counts a prompt as ``generateContent`` renders it, a cache's content included."""
    client = gemini(server)
    cache = make(client)
    assert (cache.expire_time - cache.create_time).total_seconds() == pytest.approx(600, abs=1)
    assert [m.name for m in client.models.list()] == ["models/tiny"]
    counted = client.models.count_tokens(model="tiny", contents="hi").total_tokens
    assert counted == ask(client, None, "hi").usage_metadata.prompt_token_count
    body = {"contents": [{"parts": [{"text": "hi"}]}], "cachedContent": cache.name}
    key = {"x-goog-api-key": "alice-key"}
    with_cache = httpx.post(f"{server.base_url}/v1beta/models/tiny:countTokens", json=body, headers=key)
    assert with_cache.json()["totalTokens"] == ask(client, cache.name, "hi").usage_metadata.prompt_token_count


def test_clearing_the_cache_deletes_the_named_caches_it_held(server) -> None:
    """``POST /v1/cache/clear`` takes the named caches' blocks, so it deletes them too: none is
    left listed with blocks that are gone."""
    client = gemini(server)
    make(client)
    cleared = httpx.post(
        f"{server.base_url}/v1/cache/clear", headers={"Authorization": "Bearer admin"}, timeout=120
    )
    assert cleared.json()["removed_named_caches"] == 1
    assert list(client.caches.list()) == [] and stats(server)["deployment"]["pinned_bytes"] == 0


def test_bad_named_caches_are_refused_in_each_dialect(server) -> None:
    """Content under a block, no model, both ``ttl`` and ``expireTime``, a system instruction
    beside a cached content, another model: 400s in Google's shape (or the dialect's own)."""
    client = gemini(server)
    with pytest.raises(genai_errors.ClientError) as small:
        make(client, document="short")
    assert small.value.code == 400 and "too small" in small.value.message
    r = httpx.post(
        f"{server.base_url}/v1beta/cachedContents",
        json={"contents": [{"parts": [{"text": DOCUMENT}]}]},
        headers={"x-goog-api-key": "alice-key"},
    )
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    cache = make(client)
    with pytest.raises(genai_errors.ClientError) as both:
        ask(client, cache.name, "hi", system_instruction="another")
    assert both.value.code == 400 and "system instruction" in both.value.message
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="alice-key", max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(
            model="tiny",
            max_tokens=4,
            system="mine",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"cached_content": cache.name},
        )
    unknown = httpx.get(
        f"{server.base_url}/v1beta/cachedContents/nope", headers={"x-goog-api-key": "alice-key"}
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    anonymous = httpx.get(f"{server.base_url}/v1beta/cachedContents")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["status"] == "UNAUTHENTICATED"
    assert httpx.get(f"{server.base_url}/v1beta/cachedContents?key=alice-key").status_code == 200
    chat = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="alice-key", max_retries=0)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    named = {"cached_content": cache.name}
    with pytest.raises(openai.BadRequestError, match="tools"):  # NOTE: rendered before the cache's content
        chat.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[tool], extra_body=named
        )
    with pytest.raises(openai.BadRequestError, match="cached_content"):  # NOTE: refused, not ignored
        chat.completions.create(model="tiny", prompt="hi", max_tokens=1, extra_body=named)
    with pytest.raises(genai_errors.ClientError, match="tools"):
        ask(
            client,
            cache.name,
            "hi",
            tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="f")])],
        )


def test_the_pinned_budget_refuses_a_cache_that_does_not_fit(settings, tiny_model, serve) -> None:
    """``--max-pinned-bytes`` of 3 of the tiny model's blocks: a 2,000-token document (15 blocks)
    gets a 429, and nothing stays pinned."""
    small = settings.model_copy(update={"api_keys": KEYS, "admin_key": "admin", "max_pinned_bytes": 200_000})
    with serve(small, tiny_model) as server:
        with pytest.raises(genai_errors.APIError) as refused:
            make(gemini(server))
        assert refused.value.code == 429 and "max-pinned-bytes" in refused.value.message
        assert stats(server)["deployment"]["pinned_bytes"] == 0
