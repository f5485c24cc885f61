"""Reuse across an agent's sessions and pauses, as Claude Code sends its requests (tiny model, real
Redis, the official ``anthropic`` client): its per-session billing block is no part of the prompt
(``proxy.serving.metadata``), and a 5-minute breakpoint keeps its blocks for the server's
``--ttl`` unless ``--client-ttl exact`` (``proxy.serving.validation.kept_ttl``)."""

from __future__ import annotations

import anthropic
import httpx

from tests.api import Api
from tests.helpers import TRAINING_TEXT

SYSTEM = " ".join(TRAINING_TEXT) * 11  # about 1,050 tokens of the tiny tokenizer
EPHEMERAL = {"type": "ephemeral"}  # NOTE: Claude Code's mark: no ttl, Anthropic's 5 minutes
RULE = "claude-code-billing-header"


def billing(version: str, cch: str) -> str:
    """Claude Code's first system block (its shape in Claude Code 2.1.197)."""
    return f"x-anthropic-billing-header: cc_version=2.1.197.{version}; cc_entrypoint=cli; cch={cch};"


def body(version: str = "a1b", cch: str = "1c8b4") -> dict:
    """A Claude Code request: the billing block, its identity and instructions (marked), a question."""
    return {
        "model": "tiny",
        "max_tokens": 4,
        "temperature": 0,
        "system": [
            {"type": "text", "text": billing(version, cch)},
            {"type": "text", "text": "You are a CLI for the tiny model.", "cache_control": EPHEMERAL},
            {"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Why are blocks hashed?", "cache_control": EPHEMERAL}],
            }
        ],
    }


def create(server, request: dict) -> anthropic.types.Message:
    sdk = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    fields = {k: v for k, v in request.items() if k != "temperature"}
    return sdk.messages.create(**fields, extra_body={"temperature": request["temperature"]})


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def test_a_new_session_reuses_all_but_the_last_token(cached) -> None:
    """Two sessions whose requests differ only in the billing block's version suffix and ``cch``:
    the second reads every token from the cache but the last; the explanation names the rule
    and the block it left out."""
    first = create(cached.server, body("a1b", "1c8b4"))
    cached.flush()
    second = httpx.post(
        f"{cached.server.base_url}/v1/messages",
        json=body("f51", "defa0"),
        headers={"x-kvproxy-explain": "1"},
        timeout=120,
    ).json()
    n = prompt_tokens(first.usage)
    assert n > 1000 and second["usage"]["cache_read_input_tokens"] == n - 1
    assert second["usage"]["input_tokens"] + second["usage"]["cache_creation_input_tokens"] == 1
    assert second["kvproxy_cache_explanation"]["left_out"] == [{"rule": RULE, "param": "system[0]"}]


def test_a_billing_block_in_a_system_message_is_left_out(cached) -> None:
    """The block sent in a ``system`` message inside ``messages`` (as a gateway or SDK may place
    it) is left out too: a message that held only it is no part of the prompt, and one with text
    after it keeps that text; the explanation names where each was."""
    request = body()
    only, before = {"role": "system", "content": billing("a1b", "1c8b4")}, request["messages"]
    joined = {
        "role": "system",
        "content": [{"type": "text", "text": billing("f51", "defa0") + "\nBe brief."}],
    }
    with_them = {**request, "messages": [only, *before, joined]}
    without = {**request, "messages": [*before, {"role": "system", "content": "Be brief."}]}
    sdk = anthropic.Anthropic(base_url=cached.server.base_url, api_key="unused", max_retries=0)
    counts = [
        sdk.messages.count_tokens(**{k: v for k, v in r.items() if k not in ("max_tokens", "temperature")})
        for r in (with_them, without)
    ]
    assert counts[0].input_tokens == counts[1].input_tokens
    explained = httpx.post(
        f"{cached.server.base_url}/v1/messages",
        json=with_them,
        headers={"x-kvproxy-explain": "1"},
        timeout=120,
    ).json()["kvproxy_cache_explanation"]["left_out"]
    assert explained == [
        {"rule": RULE, "param": "system[0]"},
        {"rule": RULE, "param": "messages[0].content"},
        {"rule": RULE, "param": "messages[2].content[0]"},
    ]


def test_a_conversation_of_metadata_alone_is_rendered_as_sent(cached) -> None:
    """A ``messages`` list that holds only billing blocks keeps them (nothing else would be left
    to render: before, a 500), on ``/v1/messages`` and ``count_tokens``."""
    only = {"role": "system", "content": [{"type": "text", "text": billing("a1b", "1c8b4")}]}
    request = {"model": "tiny", "max_tokens": 2, "temperature": 0, "messages": [only]}
    answered = httpx.post(f"{cached.server.base_url}/v1/messages", json=request, timeout=120)
    assert answered.status_code == 200, answered.text
    counted = httpx.post(
        f"{cached.server.base_url}/v1/messages/count_tokens",
        json={"model": "tiny", "messages": [only]},
        timeout=120,
    )
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0, counted.text


def test_keep_client_metadata_renders_the_block(settings, tiny_model, serve) -> None:
    """With ``--keep-client-metadata`` the billing block is prompt: a new session's first block
    differs, so nothing is reused, and the explanation names nothing left out."""
    with serve(settings.model_copy(update={"keep_client_metadata": True}), tiny_model) as server:
        first = create(server, body("a1b", "1c8b4"))
        Api(server).flush()
        second = httpx.post(
            f"{server.base_url}/v1/messages",
            json=body("f51", "defa0"),
            headers={"x-kvproxy-explain": "1"},
            timeout=120,
        ).json()
    assert prompt_tokens(first.usage) > 1000 and second["usage"]["cache_read_input_tokens"] == 0
    assert second["kvproxy_cache_explanation"]["left_out"] == []


def test_count_tokens_leaves_the_block_out_as_messages_does(cached) -> None:
    """``count_tokens`` counts the prompt ``/v1/messages`` computes: the billing block left out."""
    sdk = anthropic.Anthropic(base_url=cached.server.base_url, api_key="unused", max_retries=0)
    request = {k: v for k, v in body().items() if k not in ("max_tokens", "temperature")}
    without = {**request, "system": request["system"][1:]}
    counted = sdk.messages.count_tokens(**request).input_tokens
    assert counted == sdk.messages.count_tokens(**without).input_tokens
    assert counted == prompt_tokens(create(cached.server, body()).usage)


def block_ttls(redis_client, key_prefix: str) -> list[int]:
    """The TTL (seconds) the index holds for each block entry of the test's keys."""
    return sorted(redis_client.ttl(k) for k in redis_client.scan_iter(f"{key_prefix}*:b:*"))


def test_a_5m_breakpoint_is_kept_for_the_servers_ttl(
    settings, tiny_model, serve, redis_client, key_prefix
) -> None:
    """Under the default ``--client-ttl floor`` the blocks a 5-minute breakpoint covers are kept
    for the server's hour (read after 5 minutes they still hit), while the usage still counts
    them as ``ephemeral_5m``, as the client asked."""
    with serve(settings.model_copy(update={"ttl": 3600}), tiny_model) as server:
        reply = create(server, body())
        Api(server).flush()
        ttls = block_ttls(redis_client, key_prefix)
    assert len(ttls) >= 8 and min(ttls) > 300
    split = reply.usage.cache_creation
    assert split is not None and split.ephemeral_5m_input_tokens >= 8 * 128


def test_client_ttl_exact_expires_a_5m_breakpoint_at_5_minutes(
    settings, tiny_model, serve, redis_client, key_prefix
) -> None:
    """``--client-ttl exact``: the blocks the breakpoint covers expire at its 5 minutes, as on the
    hosted API."""
    exact = settings.model_copy(update={"ttl": 3600, "client_ttl": "exact"})
    with serve(exact, tiny_model) as server:
        create(server, body())
        Api(server).flush()
        ttls = block_ttls(redis_client, key_prefix)
    assert len(ttls) >= 8 and max(ttls) <= 300
