"""Starting a turn (``proxy.serving.turn``) on the engine, and reading its whole answer: the one
path every dialect's generating route takes, so the same conversation gets the same prompt,
boundaries, TTLs, sampling and answer grammar whichever API it came through. The engine's
``GenerationRequest`` is built here, and the next turn's start is handed to it ahead."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from engine.requests import Finished, GenerationRequest, TokenDelta
from engine.sampling import SamplingParams
from engine.worker import Engine
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.http.warnings import warning_headers
from proxy.serving.ahead import next_turn_start
from proxy.serving.facts import ModelFacts
from proxy.serving.prompts import layout, render_turn
from proxy.serving.running import Started, complete, start
from proxy.serving.turn import Rendered, Sampling, Turn, Usage
from proxy.serving.validation import check_model, completion_budget, kept_ttl, token_bias
from proxy.tools.answer import AnswerPlan, plan_answer
from proxy.tools.prompt import tools_span
from proxy.tools.rendering import TemplateMessage
from proxy.tools.spec import OpenAITool, ToolCall
from store.interface import TtlPlan


@dataclass(frozen=True)
class Begun:
    """A started turn: its prompt, how its answer is read, the engine's request and the running
    request (whose ``done`` says what was cached), and the TTL plan its client asked
    (``asked_ttl``: the hosted accounting of its usage; its blocks are kept as
    ``generation.cache_ttl_s``, ``proxy.serving.validation.kept_ttl``)."""

    turn: Turn
    prompt: Rendered
    plan: AnswerPlan
    generation: GenerationRequest
    started: Started
    asked_ttl: TtlPlan = None

    def usage(self, completion_tokens: int) -> Usage:
        """The turn's usage once ``completion_tokens`` were generated."""
        return self.started.usage(completion_tokens)


@dataclass(frozen=True)
class Answer:
    """A finished turn: its text (all of it: ``raw``; without the calls: ``text``), its calls,
    why it ended, its tokens and its usage."""

    raw: str
    text: str
    calls: list[ToolCall]
    finished: Finished
    tokens: list[TokenDelta]
    usage: Usage

    @property
    def finish_reason(self) -> str:
        return self.finished.finish_reason


async def start_turn(
    turn: Turn, request: Request, engine: Engine, tokenizer: Any, facts: ModelFacts, settings: Settings
) -> Begun:
    """Check, render and start ``turn``: its model; off the event loop, its prompt (``render_turn``),
    its TTL plan and tail boundaries (``layout``; the blocks kept as ``kept_ttl`` says) and its
    answer's grammar (``plan_answer``); then the engine's request, submitted, with render-ahead
    of the next turn's start (chats) and the tool definitions' span for an explanation (which
    also names the client metadata the dialect left out). Returns once the prompt is computed, its
    headers holding the turn's and its plan's warnings (``proxy.http.warnings``).

    Raises:
        OpenAIError: 404 for a model not served; 400 naming the field (``Turn.params``) the
            turn cannot be served for; 503 when the engine is busy; 499 when the client left.
    """
    check_model(facts, turn.model)

    def prepare() -> tuple[Rendered, Any, tuple[int, ...], AnswerPlan]:
        prompt = render_turn(tokenizer, facts.vocab_size, turn)
        ttl, boundaries = layout(tokenizer, turn, prompt, settings.max_ttl)
        params = turn.params
        plan = plan_answer(
            tokenizer,
            facts.vocab_size,
            turn.tools,
            turn.schema,
            params.schema,
            params.tools,
            turn.call_prefix,
            turn.schema_strict,
        )
        return prompt, ttl, boundaries, plan

    prompt, asked, boundaries, plan = await run_in_threadpool(prepare)  # NOTE: big prompts take a while
    generation = generation_request(facts, settings, turn, prompt.ids, kept_ttl(settings, asked))
    generation = dataclasses.replace(generation, boundaries=boundaries, grammar=plan.grammar)
    ahead, span = None, None
    if turn.messages is not None:
        # NOTE: after a prefill, the next turn holds the whole assistant turn: prefill and answer
        history = prompt.messages[:-1] if turn.prefill is not None else prompt.messages
        said = partial(plan.history_message, echo=turn.echo_arguments)
        ahead = render_ahead(
            engine, tokenizer, settings, history, generation, said, prompt.data, prompt.tools
        )
        if ahead is not None and turn.prefill is not None:
            ahead = partial(_continued, ahead, turn.prefill)
        if turn.tools is not None:
            raw, tools, fmt = turn.messages, turn.tools, plan.format
            span = partial(tools_span, tokenizer, raw, tools, fmt, prompt.ids, prompt.data)
    started = await start(request, engine, tokenizer, facts, generation, ahead, span)
    if started.explanation is not None and turn.left_out:
        started.explanation = dataclasses.replace(started.explanation, left_out=turn.left_out)
    started.headers.update(warning_headers(turn.warnings + plan.warnings))
    return Begun(turn, prompt, plan, generation, started, asked)


def _continued(ahead: Callable[[str], object], prefilled: str, answer: str) -> object:
    """``ahead`` of the whole assistant turn: the prefill and its continuation."""
    return ahead(prefilled + answer)


async def finish_turn(begun: Begun, request: Request) -> Answer:
    """Wait for the whole answer of a started turn and read it (text and calls); a client that
    goes away cancels the generation.

    Raises:
        Exception: the engine's error for the request.
    """
    result = await complete(begun.started, request)
    assert result.finished is not None  # NOTE: a completion that ends without error is finished
    text, calls = begun.plan.read(result.text)
    return Answer(result.text, text, calls, result.finished, result.tokens, result.usage)


def sampling_params(sampling: Sampling, vocab_size: int) -> SamplingParams:
    """The engine's sampling parameters: OpenAI's defaults for the fields not given (temperature
    and top_p 1, no seed, no penalties, no bias).

    Raises:
        ValueError: a ``logit_bias`` key outside the vocabulary (``token_bias``).
    """
    bias = token_bias(sampling.logit_bias, vocab_size)
    return SamplingParams(
        temperature=1.0 if sampling.temperature is None else sampling.temperature,
        top_p=1.0 if sampling.top_p is None else sampling.top_p,
        seed=sampling.seed,
        presence_penalty=sampling.presence_penalty or 0.0,
        frequency_penalty=sampling.frequency_penalty or 0.0,
        logit_bias=tuple(bias.items()),
    )


def generation_request(
    facts: ModelFacts, settings: Settings, turn: Turn, prompt_ids: list[int], ttl: TtlPlan
) -> GenerationRequest:
    """Check the prompt's length against the context and build the engine's request for ``turn``
    (its blocks kept as ``ttl`` plans).

    Raises:
        OpenAIError: see ``completion_budget``; a ``logit_bias`` key outside the vocabulary (400).
    """
    n, prompt = len(prompt_ids), turn.params.prompt
    budget = completion_budget(facts, settings, n, turn.max_tokens, prompt, turn.to_window)
    try:
        sampling = sampling_params(turn.sampling, facts.vocab_size)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="logit_bias") from exc
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        max_tokens=budget,
        sampling=sampling,
        stop=turn.stop,
        top_logprobs=turn.top_logprobs,
        tenant=turn.tenant,
        cache_ttl_s=ttl,
    )


def render_ahead(
    engine: Engine,
    tokenizer: Any,
    settings: Settings,
    messages: Sequence[TemplateMessage],
    generation: GenerationRequest,
    said: Callable[[str], TemplateMessage],
    data: dict[str, Any] | None = None,
    tools: list[OpenAITool] | None = None,
) -> Callable[[str], object] | None:
    """What ``proxy.serving.running.start`` calls with a chat turn's answer: the next turn's
    start, rendered on a worker thread, handed to the engine (``Engine.render_ahead``) with the
    request's tenant and TTLs (``tokenizer``: the served model's; ``said``: the answer's text as
    the next request's history holds it, ``AnswerPlan.history_message``). None when the cache
    or render-ahead is off."""
    if engine.cache is None or settings.no_render_ahead:
        return None
    loop = asyncio.get_running_loop()

    def job(answer: str) -> None:
        ids = next_turn_start(tokenizer, messages, said(answer), data, tools)
        if len(ids) > len(generation.prompt_ids):
            ttls = generation.cache_ttl_s
            engine.render_ahead(
                GenerationRequest(tuple(ids), 1, tenant=generation.tenant, cache_ttl_s=ttls, prewarm=True)
            )

    return lambda answer: loop.run_in_executor(None, job, answer)
