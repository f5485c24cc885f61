"""Conversations: each turn of a growing chat reuses every stored block it shares with
earlier turns (their prompts and, where the template reproduces them, their replies)."""

from __future__ import annotations

import argparse
import inspect

from openai import OpenAI

from hashing import BLOCK_SIZE

MODEL = "smollm2-135m-instruct"
SYSTEM = inspect.getdoc(argparse)
QUESTIONS = ["What does this module do?", "Give one example of its use.", "Name one alternative.", "Thanks!"]


def render(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def chat(server, messages):
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=60, extra_body={"return_token_ids": True}
    )
    return reply, reply.choices[0].model_extra["token_ids"]


def test_growing_chat_hits_every_shared_block(settings, default_model, serve) -> None:
    tokenizer, eos = default_model.tokenizer, default_model.tokenizer.eos_token_id
    stored: list[list[int]] = []  # token sequences whose full blocks the server has stored
    messages = [{"role": "system", "content": SYSTEM}]
    no_cache = settings.model_copy(update={"no_cache": True})
    with serve(settings, default_model) as server, serve(no_cache, default_model) as cold:
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            prompt = render(tokenizer, messages)
            reused = max((min(common_prefix(prompt, s), len(s)) for s in stored), default=0)
            expected = min(BLOCK_SIZE * (reused // BLOCK_SIZE), len(prompt) - 1)

            reply, generated = chat(server, messages)
            reference, _ = chat(cold, messages)
            server.app.state.engine.cache.flush(60)

            assert reply.usage.prompt_tokens == len(prompt)
            assert reply.usage.prompt_tokens_details.cached_tokens == expected, question
            assert reply.choices[0].message.content == reference.choices[0].message.content
            # what the server stored: the prompt's blocks, and those of prompt + reply (+ EOS),
            # up to the last token that was fed to the model
            sequence = prompt + generated + ([eos] if reply.choices[0].finish_reason == "stop" else [])
            stored.append(sequence[: BLOCK_SIZE * ((len(sequence) - 1) // BLOCK_SIZE)])
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        assert expected > 0  # the last turn did hit
