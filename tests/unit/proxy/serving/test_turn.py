"""proxy/serving/prompts.py and validation.py on a turn: rendered, laid out and checked with a
tokenizer and the model's facts only (no model is loaded)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.sampling import SamplingParams
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.serving.facts import ModelFacts
from proxy.serving.prompts import layout, render_turn, ttl_plan
from proxy.serving.starting import sampling_params
from proxy.serving.turn import CacheMark, Params, Sampling, Turn
from proxy.serving.validation import ContextExceeded, check_model, completion_budget
from proxy.tools.rendering import render_chat

SYSTEM = {"role": "system", "content": "You answer questions about the weather. " * 12}
USER = {"role": "user", "content": "Is it raining in Lisbon?"}


def test_a_chat_turn_is_its_template_rendered(tokenizer: Any, facts: ModelFacts) -> None:
    """A turn's prompt is the chat template over its messages, with the generation prompt; what
    the template got is kept for render-ahead."""
    prompt = render_turn(tokenizer, facts.vocab_size, Turn("tiny", "t", messages=[SYSTEM, USER]))
    assert prompt.ids == prompt.rendered == render_chat(tokenizer, [SYSTEM, USER])
    assert prompt.messages == [SYSTEM, USER] and prompt.tools is None


def test_prompt_of_changes_the_computed_ids_not_the_rendered_ones(tokenizer: Any, facts: ModelFacts) -> None:
    """``Turn.prompt_of`` (a stored conversation's ids) replaces what is computed; the rendering
    stays what the template wrote."""
    turn = Turn("tiny", "t", messages=[USER], prompt_of=lambda ids: [7, *ids])
    prompt = render_turn(tokenizer, facts.vocab_size, turn)
    assert prompt.ids == [7, *prompt.rendered] and prompt.rendered == render_chat(tokenizer, [USER])


def test_a_raw_prompt_is_tokenized_or_checked_against_the_vocabulary(
    tokenizer: Any, facts: ModelFacts
) -> None:
    """A string is tokenized as is; token ids outside ``[0, vocab_size)`` are a 400 naming the
    prompt's field."""
    text = Turn("tiny", "t", prompt="Once upon a time", params=Params(prompt="prompt"))
    assert render_turn(tokenizer, facts.vocab_size, text).ids == tokenizer("Once upon a time")["input_ids"]
    ids = Turn("tiny", "t", prompt=[1, 2, facts.vocab_size], params=Params(prompt="prompt"))
    with pytest.raises(OpenAIError) as refused:
        render_turn(tokenizer, facts.vocab_size, ids)
    assert refused.value.param == "prompt"
    assert (
        refused.value.message
        == f"token id {facts.vocab_size} is outside the vocabulary [0, {facts.vocab_size})"
    )


def test_a_prefill_leaves_the_assistant_turn_open(tokenizer: Any, facts: ModelFacts) -> None:
    """With a prefill the prompt ends with the assistant's text: no end of turn, no new turn."""
    turn = Turn("tiny", "t", messages=[USER, {"role": "assistant", "content": "Yes, it"}], prefill="Yes, it")
    ids = render_turn(tokenizer, facts.vocab_size, turn).ids
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\nYes, it")


def test_a_cache_mark_sets_the_ttl_plan_and_a_tail(tokenizer: Any, facts: ModelFacts) -> None:
    """A mark on the system message keeps the blocks up to its end for the mark's TTL (capped at
    ``--max-ttl``) and stores a tail where it ends; later blocks take the server's TTL."""
    turn = Turn("tiny", "t", messages=[SYSTEM, USER], marks=(CacheMark(0, 7200),))
    prompt = render_turn(tokenizer, facts.vocab_size, turn)
    end = len(render_chat(tokenizer, [SYSTEM], add_generation_prompt=False))
    assert 128 < end < len(prompt.ids)
    ttl, boundaries = layout(tokenizer, turn, prompt, max_ttl=3600)
    assert boundaries == (end,)
    assert ttl == ttl_plan(len(prompt.ids), [(end, 3600)]) == (3600,) * -(-end // 128)


def test_without_marks_the_turn_ttl_stands(tokenizer: Any, facts: ModelFacts) -> None:
    """A turn without marks keeps its own TTL; the system prompt's end is still a tail boundary."""
    turn = Turn("tiny", "t", messages=[SYSTEM, USER], ttl=600)
    prompt = render_turn(tokenizer, facts.vocab_size, turn)
    end = len(render_chat(tokenizer, [SYSTEM], add_generation_prompt=False))
    assert layout(tokenizer, turn, prompt, max_ttl=3600) == (600, (end,))


def test_ttl_plan_blocks() -> None:
    """A block takes the TTL of the first mark at or after its end, or the longest of those inside
    it; blocks past every mark take the server's (None), and trailing ones are left out."""
    assert ttl_plan(400, [(128, 60)]) == (60,)
    assert ttl_plan(400, [(100, 60), (200, 3600)]) == (3600, 3600)
    assert ttl_plan(400, []) == ()


def test_sampling_defaults_are_openais() -> None:
    """Fields not given take OpenAI's defaults; a bias's keys are token ids of the vocabulary."""
    assert sampling_params(Sampling(), 400) == SamplingParams()
    given = Sampling(temperature=0.0, seed=3, logit_bias={"7": 5.0})
    assert sampling_params(given, 400) == SamplingParams(temperature=0.0, seed=3, logit_bias=((7, 5.0),))
    with pytest.raises(ValueError, match="not a token id"):
        sampling_params(Sampling(logit_bias={"400": 1.0}), 400)


def test_the_budget_is_what_the_context_leaves(facts: ModelFacts) -> None:
    """Without ``max_tokens`` a completion may fill the context, up to ``--default-max-tokens``
    unless the turn may fill the window (a Responses request); a prompt that fills the context is
    refused, naming the prompt's field."""
    settings = Settings(default_max_tokens=100)
    assert completion_budget(facts, settings, 500, None, "messages") == 12
    assert completion_budget(facts, settings, 10, None, "messages") == 100
    assert completion_budget(facts, settings, 10, None, "input", to_window=True) == 502
    assert completion_budget(facts, settings, 10, 7, "input", to_window=True) == 7
    with pytest.raises(OpenAIError) as refused:
        completion_budget(facts, settings, 512, None, "contents")
    assert (refused.value.status, refused.value.param) == (400, "contents")


def test_a_request_over_the_context_keeps_its_numbers(facts: ModelFacts) -> None:
    """A refusal carries the prompt's length, the ``max_tokens`` asked and the context, for each
    dialect to word: the prompt alone is too long past ``context - 1`` tokens (whatever
    ``max_tokens`` asks; naming the prompt), else it is too long with ``max_tokens`` (naming it)."""
    settings = Settings()
    with pytest.raises(ContextExceeded) as alone:
        completion_budget(facts, settings, 512, 10, "messages")
    assert (alone.value.prompt_tokens, alone.value.max_tokens, alone.value.context) == (512, 10, 512)
    assert alone.value.prompt_alone and alone.value.max_prompt_tokens == 511
    assert (alone.value.param, alone.value.code) == ("messages", "context_length_exceeded")
    with pytest.raises(ContextExceeded) as both:
        completion_budget(facts, settings, 511, 2, "messages")
    assert (both.value.prompt_tokens, both.value.max_tokens, both.value.param) == (511, 2, "max_tokens")
    assert not both.value.prompt_alone
    assert completion_budget(facts, settings, 511, 1, "messages") == 1


def test_a_model_is_served_under_its_names(facts: ModelFacts) -> None:
    """The name and the aliases are served; another is a 404 that lists them."""
    check_model(facts, "alias")
    with pytest.raises(OpenAIError) as refused:
        check_model(facts, "gpt-4")
    assert refused.value.status == 404
    assert refused.value.message == "The model 'gpt-4' does not exist; this server serves 'tiny', 'alias'"
