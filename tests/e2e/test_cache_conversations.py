"""Conversations: each turn of a growing chat reuses every stored token it continues: earlier
turns' prompts and replies, the system prompt's end, and the next turn's start the server
computed ahead (``engine.render_ahead``)."""

from __future__ import annotations

import argparse
import inspect

from openai import OpenAI

from hashing import BLOCK_SIZE
from proxy.serving.ahead import next_turn_start
from proxy.tools.rendering import render_chat
from tests.helpers import HANG_S, wait_for

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


def reusable(prompt: list[int], stored: list[int]) -> int:
    """Tokens of ``prompt`` the cache serves from what a request stored for ``stored``: its
    blocks, then its tail, when the prompt continues it with all of the tail or all but its
    last token (``hashing.tails``); else the blocks they share."""
    shared = common_prefix(prompt, stored)
    if shared >= len(stored) - 1:
        return min(shared, len(stored))
    return BLOCK_SIZE * (shared // BLOCK_SIZE)


def end_of_answer(text: str, answers: int) -> int:
    """Where the ``answers``-th assistant message ends (its end-of-turn marker and newline) in a
    rendered chat, in characters."""
    position = 0
    for _ in range(1 + 2 * answers):  # the system message, then each question and answer
        position = text.index("<|im_end|>\n", position) + len("<|im_end|>\n")
    return position


def settle(server, turns: int) -> None:
    """Wait until the server computed the next-turn start of ``turns`` turns, and stored it."""
    engine = server.app.state.engine
    wait_for(
        lambda: engine.ahead.submitted >= turns and engine.ahead.settled and engine.idle,
        what="render-ahead to settle",
    )
    assert engine.cache.flush(HANG_S)


def test_each_turn_reuses_the_whole_conversation_so_far(settings, default_model, serve) -> None:
    """Four turns: each reuses every token the server stored that it continues (the system
    prompt's end, earlier prompts, earlier answers to their last token, the next-turn start the
    server computed ahead), so turn k+1 reuses at least through turn k's assistant message; the
    answers equal a --no-cache server's."""
    tokenizer, eos = default_model.tokenizer, default_model.tokenizer.eos_token_id
    messages = [{"role": "system", "content": SYSTEM}]
    system = render_chat(tokenizer, messages, add_generation_prompt=False)
    stored: list[list[int]] = []
    counts, ends = [], []
    no_cache = settings.model_copy(update={"no_cache": True})
    with serve(settings, default_model) as server, serve(no_cache, default_model) as cold:
        for turn, question in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": question})
            prompt = render(tokenizer, messages)
            expected = min(max((reusable(prompt, s) for s in stored), default=0), len(prompt) - 1)

            reply, generated = chat(server, messages)
            reference, _ = chat(cold, messages)

            cached = reply.usage.prompt_tokens_details.cached_tokens
            counts.append(cached)
            assert reply.usage.prompt_tokens == len(prompt)
            assert cached == expected, question
            assert reply.choices[0].message.content == reference.choices[0].message.content
            if turn:
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                ends.append(
                    len(tokenizer(text[: end_of_answer(text, turn)], add_special_tokens=False)["input_ids"])
                )
                assert cached >= ends[-1], question
            # what the server stored: the system prompt's end, the prompt, prompt + reply (+ EOS)
            # to its last token, and once idle, the next turn's start
            answered = prompt + generated + ([eos] if reply.choices[0].finish_reason == "stop" else [])
            stored += [system, prompt, answered]
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            settle(server, turn + 1)
            stored.append(next_turn_start(tokenizer, messages[:-1], messages[-1]))
    print(f"\ncached tokens per turn: {counts}; turn k's answer ends at {ends} in turn k+1")
