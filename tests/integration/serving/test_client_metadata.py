"""Client metadata that reaches the chat route (tiny model, real Redis, the official ``openai``
client): Claude Code's billing header passed on by a gateway that translates Messages into chat
completions, at the start of the system message, is left out of the prompt
(``proxy.serving.metadata``); the same text elsewhere is prompt."""

from __future__ import annotations

import httpx
from openai import OpenAI

from tests.helpers import TRAINING_TEXT

SYSTEM = " ".join(TRAINING_TEXT) * 11  # about 1,050 tokens of the tiny tokenizer


def header(version: str, cch: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.197.{version}; cc_entrypoint=cli; cch={cch};"


def ask(server, system: object, user: str = "Why are blocks hashed?"):
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model="tiny",
        max_tokens=4,
        temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
    )


def test_a_gateways_system_message_reuses_all_but_the_last_token(cached) -> None:
    """The header joined to the system text (as a gateway joins Messages' system blocks) or sent
    as the system message's first text part: a new session reads all but the last token, and the
    explanation names what was left out."""
    first = ask(cached.server, header("a1b", "1c8b4") + SYSTEM)
    cached.flush()
    parts = [{"type": "text", "text": header("f51", "defa0")}, {"type": "text", "text": SYSTEM}]
    second = ask(cached.server, parts)
    n = first.usage.prompt_tokens
    assert n > 1000 and second.usage.prompt_tokens == n
    assert second.usage.prompt_tokens_details.cached_tokens == n - 1
    explained = httpx.post(
        f"{cached.server.base_url}/v1/chat/completions",
        json={
            "model": "tiny",
            "max_tokens": 1,
            "messages": [
                {"role": "developer", "content": header("5b4", "0aaa9") + "\n" + SYSTEM},
                {"role": "user", "content": "Why are blocks hashed?"},
            ],
        },
        headers={"x-kvproxy-explain": "1"},
        timeout=120,
    ).json()
    assert explained["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    left_out = [{"rule": "claude-code-billing-header", "param": "messages[0].content"}]
    assert explained["kvproxy_cache_explanation"]["left_out"] == left_out


def test_the_header_outside_a_system_message_is_prompt(cached) -> None:
    """A user message that starts with the header's text is rendered as sent: only a system
    message's leading metadata is left out."""
    with_header = ask(cached.server, SYSTEM, header("a1b", "1c8b4") + " Why?")
    without = ask(cached.server, SYSTEM, " Why?")
    assert with_header.usage.prompt_tokens > without.usage.prompt_tokens
