"""Render-ahead (``engine.render_ahead``): after each chat turn, the next turn's start is computed
in idle time, so turn k+1 reuses its whole history through turn k's answer as the template
renders it again, on ChatML and on a reasoning-style template that drops earlier answers'
reasoning; answers equal a --no-cache server's. Through the official ``openai`` client."""

from __future__ import annotations

import pytest
from openai import OpenAI

from engine.requests import GenerationRequest
from tests.api import Api
from tests.helpers import wait_for

SYSTEM = "You are a careful assistant. " * 12
QUESTIONS = ["What is a prefix cache?", "Why 128 tokens?", "And what is a tail?", "Thanks, bye."]


def settle(api: Api, turns: int) -> None:
    """Wait until the server has computed the next-turn starts of ``turns`` turns and stored them."""
    engine = api.engine
    wait_for(
        lambda: engine.ahead.submitted >= turns and engine.ahead.settled and engine.idle,
        what="render-ahead to settle",
    )
    api.flush()


def end_of_answer(tokenizer, messages: list[dict], answers: int) -> int:
    """Tokens of the rendered ``messages`` through the end of the ``answers``-th assistant message
    (its end-of-turn marker and the newline after it)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    position = 0
    for _ in range(1 + 2 * answers):  # the system message, then each user and assistant message
        position = text.index("<|im_end|>\n", position) + len("<|im_end|>\n")
    return len(tokenizer(text[:position], add_special_tokens=False)["input_ids"])


def conversation(api: Api, **extra) -> tuple[list[int], list[str], list[int]]:
    """Four turns: each turn's cached tokens, answer, and where turn k's answer ends in turn k+1."""
    client = OpenAI(base_url=f"{api.server.base_url}/v1", api_key="unused")
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    cached, answers, ends = [], [], []
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        if turn:
            ends.append(end_of_answer(api.engine.loaded.tokenizer, messages, turn))
        reply = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, **extra
        )
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        answers.append(reply.choices[0].message.content)
        messages.append({"role": "assistant", "content": answers[-1]})
        if api.cache is not None:
            settle(api, turn + 1)
    return cached, answers, ends


@pytest.mark.parametrize("model", ["tiny_model", "thinking_model"])
def test_each_turn_reuses_its_history_through_the_last_answer(request, model, settings, serve) -> None:
    loaded = request.getfixturevalue(model)
    # NOTE: on the reasoning template, a bias makes each answer close its (empty) reasoning
    # section first; the next turn's history drops the section, "<think>\n</think>" (the
    # generation prompt opened it), so it is never the prompt plus the answer
    think_end = loaded.tokenizer.convert_tokens_to_ids("</think>")
    extra = {"logit_bias": {str(think_end): 15}} if model == "thinking_model" else {}
    with (
        serve(settings, loaded) as cached_server,
        serve(settings.model_copy(update={"no_cache": True}), loaded) as cold_server,
    ):
        cached, answers, ends = conversation(Api(cached_server), **extra)
        _, cold_answers, _ = conversation(Api(cold_server), **extra)
    print(f"\n{model}: cached tokens per turn {cached}; turn k's answer ends at {ends} in turn k+1")
    assert answers == cold_answers
    assert all(c >= end for c, end in zip(cached[1:], ends, strict=True)), (cached, ends)
    if model == "thinking_model":
        assert any("</think>" in a for a in answers), answers  # reasoning was there to drop


def test_without_render_ahead_a_reasoning_template_recomputes_each_answer(
    thinking_model, settings, serve
) -> None:
    """--no-render-ahead: the next prompt drops the reasoning section, so it never continues the
    stored prompt + answer; the cache then stops where the answer began."""
    think_end = thinking_model.tokenizer.convert_tokens_to_ids("</think>")
    off = settings.model_copy(update={"no_render_ahead": True})
    with serve(off, thinking_model) as server:
        api = Api(server)
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        messages: list[dict] = [{"role": "system", "content": SYSTEM}]
        for turn, question in enumerate(QUESTIONS[:2]):
            messages.append({"role": "user", "content": question})
            if turn:
                end = end_of_answer(thinking_model.tokenizer, messages, turn)
            reply = client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=12, temperature=0, logit_bias={str(think_end): 15}
            )
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            api.flush()
        assert api.engine.ahead.submitted == 0
        assert reply.usage.prompt_tokens_details.cached_tokens < end


def test_a_start_that_fills_the_context_is_skipped(cached) -> None:
    """After an answer the context window ended, the next turn's start holds the whole window: no
    next turn fits, so it is skipped, never computed (which would fail past the last position)."""
    ahead, context = cached.engine.ahead, cached.engine.loaded.context_length
    skipped = ahead.skipped
    ahead.submit(GenerationRequest(tuple(range(1, context + 1)), 1, prewarm=True))
    assert (ahead.pending, ahead.skipped) == (0, skipped + 1)
