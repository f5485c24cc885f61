"""The app over real HTTP (tiny model, real Redis): routes, usage, streaming, degraded Redis."""

from __future__ import annotations

import json

import httpx
from openai import OpenAI

from hashing import BLOCK_SIZE
from proxy.config import Settings
from tests.helpers import HANG_S, RedisServer, free_port, wait_for

PROMPT = list(range(20, 20 + 2 * BLOCK_SIZE + 30))  # 286 tokens: two full blocks


def complete(base_url: str, prompt: list[int], **extra) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 5, "temperature": 0} | extra
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_repeated_prompt_is_served_from_the_cache(settings, tiny_model, serve) -> None:
    """Second send of a 286-token prompt: cached_tokens 285 (two blocks and the tail), same
    completion; keys under the prefix."""
    with serve(settings, tiny_model) as server:
        first = complete(server.base_url, PROMPT)
        assert server.app.state.engine.cache.flush(HANG_S)
        second = complete(server.base_url, PROMPT)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": len(PROMPT) - 1}
    assert first["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"] == len(PROMPT)
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


def test_openai_client_chat_and_streaming(settings, tiny_model, serve) -> None:
    """The official client: chat, streaming with usage, models; usage always has cached_tokens."""
    with serve(settings, tiny_model) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        stream = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        models = client.models.list()
    assert reply.usage is not None and reply.usage.prompt_tokens_details.cached_tokens == 0
    assert reply.choices[0].finish_reason in ("stop", "length")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == reply.choices[0].message.content
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    )
    assert [m.id for m in models.data] == ["tiny"]


def test_sse_ends_with_done(settings, tiny_model, serve) -> None:
    """Raw SSE: data lines of JSON chunks, then `data: [DONE]`; no usage chunk unless asked."""
    with serve(settings, tiny_model) as server:
        body = {"model": "tiny", "prompt": PROMPT[:10], "max_tokens": 3, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_errors_have_the_openai_shape(settings, tiny_model, serve) -> None:
    """Unknown model 404, malformed JSON 400, empty messages 400; nothing is stored."""
    with serve(settings, tiny_model) as server:
        url = server.base_url
        unknown = httpx.post(f"{url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
        malformed = httpx.post(
            f"{url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        empty = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": []})
        too_long = httpx.post(
            f"{url}/v1/completions", json={"model": "tiny", "prompt": [1] * 4000, "max_tokens": 200}
        )
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    for r in (unknown, malformed, empty, too_long):
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert not list(settings.blob_root.rglob("*.safetensors"))


def test_no_cache_server_never_caches(settings, tiny_model, serve) -> None:
    """--no-cache: health says disabled, repeats report cached_tokens 0, nothing written."""
    with serve(settings.model_copy(update={"no_cache": True}), tiny_model) as server:
        complete(server.base_url, PROMPT)
        again = complete(server.base_url, PROMPT)
        health = httpx.get(f"{server.base_url}/health").json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert health["cache"] == "disabled"
    assert not settings.blob_root.exists()


def test_a_request_without_temperature_or_length_gets_openais_defaults(settings, tiny_model, serve) -> None:
    """No temperature: sampled at 1 (seeded, the same seed's answer at temperature 1, not the greedy
    one); no max_tokens (EOS banned): a chat runs to --default-max-tokens (6), a legacy completion
    to 16 tokens, as OpenAI's."""
    with serve(settings.model_copy(update={"default_max_tokens": 6}), tiny_model) as server:
        eos = str(server.app.state.engine.loaded.tokenizer.eos_token_id)
        base = {"model": "tiny", "logit_bias": {eos: -100}, "seed": 0, "return_token_ids": True}

        def answer(route: str, **body) -> dict:
            r = httpx.post(f"{server.base_url}/v1/{route}", json=base | body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()

        unset, at_1, greedy = (
            answer("completions", prompt="The quick brown fox", **temperature)
            for temperature in ({}, {"temperature": 1}, {"temperature": 0})
        )
        ids = [doc["choices"][0]["token_ids"] for doc in (unset, at_1, greedy)]
        assert ids[0] == ids[1] != ids[2]
        assert (unset["usage"]["completion_tokens"], unset["choices"][0]["finish_reason"]) == (16, "length")
        chat = answer("chat/completions", messages=[{"role": "user", "content": "The quick brown fox"}])
        assert (chat["usage"]["completion_tokens"], chat["choices"][0]["finish_reason"]) == (6, "length")


def test_server_starts_without_redis_and_resumes_caching(tmp_path, tiny_model, serve) -> None:
    """Redis absent at start: answers uncached, /health degraded; once Redis is up, hits return."""
    redis_server = RedisServer(free_port())
    settings = Settings(  # NOTE: absent is refused at once; the timeout only bounds a slow reply
        redis_url=redis_server.url,
        blob_dir=tmp_path / "blobs",
        cache_dir=tmp_path,
        redis_retry=0.5,
        redis_timeout=5.0,
    )
    with serve(settings, tiny_model) as server:
        url = server.base_url
        assert complete(url, PROMPT)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert httpx.get(f"{url}/health").json()["cache"] == "degraded"
        redis_server.start()
        try:
            wait_for(lambda: httpx.get(f"{url}/health").json()["cache"] == "ok", what="caching to come back")

            # NOTE: a save that failed late (its writer runs in the background) keeps the cache off
            # for --redis-retry more: each request stores the prompt again, until one hits it
            def cached() -> int:
                return complete(url, PROMPT)["usage"]["prompt_tokens_details"]["cached_tokens"]

            wait_for(lambda: cached() == len(PROMPT) - 1, what="a hit")
        finally:
            redis_server.stop()
