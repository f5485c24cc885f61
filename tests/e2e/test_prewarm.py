"""Prewarm on the default model: a 1,500-token system prompt stored over HTTP is hit by the first
chat that uses it, with the answer of a --no-cache server."""

from __future__ import annotations

import argparse
import inspect

import httpx
from openai import OpenAI

MODEL = "smollm2-135m-instruct"


def system_prompt(tokenizer, tokens: int) -> str:
    """About ``tokens`` tokens of real prose (argparse's documentation, repeated)."""
    text = (inspect.getdoc(argparse) or "") + "\n"
    ids = tokenizer((text * 20), add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def test_prewarmed_system_prompt_is_hit_with_the_cold_answer(settings, default_model, serve) -> None:
    system = [{"role": "system", "content": system_prompt(default_model.tokenizer, 1500)}]
    messages = [*system, {"role": "user", "content": "Which class parses command lines?"}]
    no_cache = settings.model_copy(update={"no_cache": True})
    with serve(settings, default_model) as server, serve(no_cache, default_model) as cold:
        warmed = httpx.post(
            f"{server.base_url}/v1/cache/prewarm",
            json={"model": MODEL, "messages": system, "add_generation_prompt": False},
            timeout=300,
        ).json()
        shared = warmed["prompt_tokens"]
        assert 1500 <= shared < 1530 and warmed["stored_tokens"] == shared  # its blocks and tail

        def ask(base_url: str):
            client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")
            return client.chat.completions.create(
                model=MODEL, messages=messages, temperature=0, max_tokens=40
            )

        reply, reference = ask(server.base_url), ask(cold.base_url)
        assert reply.usage.prompt_tokens_details.cached_tokens == shared
        assert reply.choices[0].message.content == reference.choices[0].message.content
