"""Anthropic's prompt caching as its clients use it (tiny model, real Redis, the official
``anthropic`` SDK and LangChain's ``ChatAnthropic``): the SDK's 400s for broken breakpoint rules,
``usage.cache_creation`` by TTL, the streamed ``message_delta``'s cumulative counts, top-level
automatic caching, and ``x-kvproxy-explain`` on ``/v1/messages``."""

from __future__ import annotations

import functools
import operator

import anthropic
import httpx
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage, SystemMessage

from tests.helpers import HANG_S, TRAINING_TEXT

SYSTEM = " ".join(TRAINING_TEXT) * 11  # about 1,050 tokens of the tiny tokenizer


def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def block(text: str, ttl: str = "5m") -> dict:
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral", "ttl": ttl}}


def test_broken_breakpoint_rules_are_the_sdks_400s(cached) -> None:
    """Five breakpoints, or a ``1h`` one after a ``5m`` one: ``BadRequestError`` in Anthropic's
    shape with Anthropic's message."""
    sdk = client(cached.server)
    five = [block(f"part {i}") for i in range(5)]
    cases = [
        (five, [{"role": "user", "content": "hi"}], "A maximum of 4 blocks with cache_control"),
        (
            [block(SYSTEM, "5m")],
            [{"role": "user", "content": [block("hi", "1h")]}],
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block",
        ),
    ]
    for system, messages, says in cases:
        with pytest.raises(anthropic.BadRequestError) as refused:
            sdk.messages.create(model="tiny", max_tokens=4, system=system, messages=messages)
        assert refused.value.body["type"] == "error"
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        assert says in refused.value.body["error"]["message"]


def test_cache_creation_is_split_by_ttl_and_adds_up(cached) -> None:
    """A ``5m`` system block and the question after it under the server's hour: the blocks the
    breakpoint covers are ``ephemeral_5m``, the rest ``ephemeral_1h``, summing to
    ``cache_creation_input_tokens``."""
    reply = client(cached.server).messages.create(
        model="tiny",
        max_tokens=4,
        system=[block(SYSTEM)],
        messages=[{"role": "user", "content": "What is a prefix cache? " * 20}],
        extra_body={"temperature": 0},
    )
    usage, split = reply.usage, reply.usage.cache_creation
    assert split is not None and usage.cache_creation_input_tokens > 0
    assert split.ephemeral_5m_input_tokens >= 7 * 128 and split.ephemeral_1h_input_tokens > 0
    assert (
        split.ephemeral_5m_input_tokens + split.ephemeral_1h_input_tokens == usage.cache_creation_input_tokens
    )


def test_streamed_usage_equals_the_replys_in_langchain(settings, tiny_model, serve, tmp_path) -> None:
    """LangChain's ``ChatAnthropic`` reads a stream's counts from ``message_delta``: two servers
    of empty caches see the same turns (a miss, then a hit on the system block), one streamed, one
    not, and LangChain reports the same input and cache counts from both."""
    reports = []
    for stream in (False, True):
        fresh = settings.model_copy(
            update={"key_prefix": f"{settings.key_prefix}{stream}:", "blob_dir": tmp_path / str(stream)}
        )
        with serve(fresh, tiny_model) as server:
            llm = ChatAnthropic(
                base_url=server.base_url, api_key="x", model="tiny", max_tokens=6, temperature=0
            )
            for question in ("Why are blocks hashed?", "What is the capital of France?"):
                messages = [SystemMessage([block(SYSTEM)]), HumanMessage(question)]
                reply = (
                    functools.reduce(operator.add, llm.stream(messages)) if stream else llm.invoke(messages)
                )
                assert server.app.state.engine.cache.flush(HANG_S)
                reports.append((reply.usage_metadata, reply.content))
    (miss, hit, streamed_miss, streamed_hit) = reports
    assert streamed_miss == miss and streamed_hit == hit
    assert miss[0] is not None and hit[0] is not None and miss[0]["input_tokens"] > 1000
    details = miss[0]["input_token_details"]
    assert (
        details["ephemeral_5m_input_tokens"] + details["ephemeral_1h_input_tokens"] == miss[0]["input_tokens"]
    )
    assert hit[0]["input_token_details"]["cache_read"] > 1000


def test_top_level_cache_control_and_explain(cached) -> None:
    """Automatic caching (a top-level ``cache_control``) marks the end of the conversation: the
    next turn reads it; ``x-kvproxy-explain: 1`` explains the Messages route's outcome as the
    chat route's, in the body and, streamed, in the header."""
    url = f"{cached.server.base_url}/v1/messages"
    turn = [{"role": "user", "content": SYSTEM}]
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "messages": turn}
    first = httpx.post(
        url, json=body | {"cache_control": {"type": "ephemeral", "ttl": "1h"}}, timeout=120
    ).json()
    assert first["usage"]["cache_creation"]["ephemeral_1h_input_tokens"] >= 7 * 128
    cached.flush()
    follow = [*turn, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
    second = httpx.post(
        url, json=body | {"messages": follow}, headers={"x-kvproxy-explain": "1"}, timeout=120
    )
    explained = second.json()["kvproxy_cache_explanation"]
    assert second.json()["usage"]["cache_read_input_tokens"] >= 7 * 128
    assert explained["cached_tokens"] == second.json()["usage"]["cache_read_input_tokens"]
    assert second.headers["x-kvproxy-cache"] in ("hit", "partial")
    streamed = httpx.post(url, json=body | {"stream": True}, headers={"x-kvproxy-explain": "1"}, timeout=120)
    assert '"cached_tokens"' in streamed.headers["x-kvproxy-explain"]
