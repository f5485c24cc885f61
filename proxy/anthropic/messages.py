"""``POST /v1/messages``: Anthropic's Messages API on the local model, with prompt caching and
tools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import GenerationRequest
from engine.sampling import SamplingParams
from engine.worker import Engine
from proxy.anthropic import protocol as anthropic
from proxy.anthropic.caching import breakpoint_error, breakpoint_ttls, creation
from proxy.anthropic.named import messages_body
from proxy.anthropic.streaming import events
from proxy.anthropic.tools import content, message_tools, tool_breakpoints
from proxy.anthropic.turns import content_error, prefill
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.serving.ahead import chat_boundaries, render_ahead
from proxy.serving.facts import served_model
from proxy.serving.running import complete, start, written_tokens
from proxy.serving.streaming import event_stream, json_response, new_id
from proxy.serving.validation import check_model, completion_budget
from proxy.state import CacheDep, EngineDep, SettingsDep
from proxy.tools.answer import AnswerPlan, plan_answer
from proxy.tools.formats import tool_format
from proxy.tools.prompt import tool_messages, tools_span
from proxy.tools.rendering import RenderError, render_chat
from proxy.tools.spec import ToolSet

router = APIRouter()


@dataclass(frozen=True)
class Prompt:
    """A Messages body rendered: its token ids, the TTL plan its ``cache_control`` breakpoints
    give its blocks, where later prompts may diverge from it (a tail is stored at each,
    ``GenerationRequest.boundaries``), and what the template got (messages, tool definitions)."""

    ids: list[int]
    ttls: tuple[int | None, ...]
    boundaries: tuple[int, ...]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    raw: list[dict[str, Any]]
    """The messages before the tool definitions went in (``MessagesRequest.template_messages``)."""


def render(engine: Engine, body: anthropic.MessagesRequest, tools: ToolSet | None, max_ttl: int) -> Prompt:
    """The body's prompt (``Prompt``).

    A breakpoint covers the message that holds it: its token position is the length of the
    prompt rendered up to that message, when that rendering is a prefix of the whole prompt
    (chat templates render turn after turn); else it covers the whole prompt. A breakpoint on a
    tool definition covers the tools (``proxy.tools.prompt.tools_span``): they come first.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    tokenizer, fmt = engine.loaded.tokenizer, tool_format(engine.loaded.tokenizer)
    raw, breakpoints = body.template_messages()
    messages, template_tools = tool_messages(raw, tools, fmt)
    extra = body.model_extra or {}
    try:
        # NOTE: a prefill (a final assistant turn) is left open: the answer continues its text
        ids = render_chat(
            tokenizer, messages, tools=template_tools, continue_final_message=bool(prefill(body))
        )
        positions = []
        for index, ttl in breakpoints:
            head_messages, head_tools = tool_messages(raw[: index + 1], tools, fmt)
            head = render_chat(tokenizer, head_messages, tools=head_tools, add_generation_prompt=False)
            positions.append((len(head) if ids[: len(head)] == head else len(ids), min(ttl, max_ttl)))
        if tools is not None and (marks := tool_breakpoints(extra.get("tools"))):
            end = tools_span(tokenizer, raw, tools, fmt, ids)[1]
            positions += [(end, min(ttl, max_ttl)) for ttl in marks]
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc
    boundaries = {p for p, _ in positions} | set(chat_boundaries(engine, messages, ids, None, template_tools))
    ttls = breakpoint_ttls(len(ids), sorted(positions))
    return Prompt(ids, ttls, tuple(sorted(boundaries)), messages, template_tools, raw)


def accept(engine: Engine, body: anthropic.MessagesRequest) -> ToolSet | None:
    """The body's tools.

    Raises:
        OpenAIError: 404 for a model not served, 400 naming a field that cannot be honoured.
    """
    check_model(served_model(engine).facts, body.model)
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")
    for broken in (content_error(body), breakpoint_error(body)):
        if broken is not None:
            raise OpenAIError(400, broken[1], param=broken[0])
    extra = body.model_extra or {}
    return message_tools(extra.get("tools"), extra.get("tool_choice"))


def _continued(ahead: Callable[[str], object], prefilled: str, answer: str) -> object:
    """``ahead`` of the whole assistant turn: the prefill and its continuation."""
    return ahead(prefilled + answer)


@router.post("/v1/messages/count_tokens")
async def count_tokens(
    body: anthropic.CountTokensRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> dict[str, int]:
    """The prompt length of a Messages body, in tokens, as ``/v1/messages`` would render it."""
    body = await messages_body(request, engine, body, tenant)
    tools = await run_in_threadpool(accept, engine, body)  # NOTE: walks the tools' schemas
    prompt = await run_in_threadpool(render, engine, body, tools, settings.max_ttl)
    return {"input_tokens": len(prompt.ids)}


@router.post("/v1/messages")
async def messages(
    body: anthropic.MessagesRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    cache: CacheDep,
    tenant: Tenant,
) -> Any:
    body = await messages_body(request, engine, body, tenant)
    tools = await run_in_threadpool(accept, engine, body)  # NOTE: walks the tools' schemas

    def prepare() -> tuple[Prompt, AnswerPlan]:
        served = served_model(engine)
        plan = plan_answer(
            served.tokenizer, served.facts.vocab_size, tools, None, "", "tools[{i}].input_schema", "toolu_"
        )
        return render(engine, body, tools, settings.max_ttl), plan

    prompt, plan = await run_in_threadpool(prepare)
    ids = prompt.ids
    generation = GenerationRequest(
        prompt_ids=tuple(ids),
        max_tokens=completion_budget(
            served_model(engine).facts, settings, len(ids), body.max_tokens, "messages"
        ),
        sampling=SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
        ),
        stop=tuple(body.stop_sequences or ()),
        tenant=tenant,
        cache_ttl_s=prompt.ttls or None,
        boundaries=prompt.boundaries,
        grammar=plan.grammar,
    )
    # NOTE: after a prefill, the next turn holds the whole assistant turn: prefill and continuation
    prefilled = prefill(body)
    history = prompt.messages[:-1] if prefilled else prompt.messages
    ahead = render_ahead(engine, settings, history, generation, None, prompt.tools)
    if ahead is not None and prefilled:
        ahead = partial(_continued, ahead, prefilled)
    tokenizer = engine.loaded.tokenizer
    span = (
        None
        if tools is None
        else partial(tools_span, tokenizer, prompt.raw, tools, tool_format(tokenizer), ids)
    )
    started = await start(request, engine, *served_model(engine), generation, ahead, span)
    message_id = new_id("msg", "_")
    written = written_tokens(started.done, cache is not None, not settings.no_tails)
    split = creation(prompt.ttls, settings.ttl, started.done.cached_tokens, written)
    if body.stream:
        return event_stream(started, events(started, message_id, body.model, (written, split), plan))
    result = await complete(started, request)
    assert result.finished is not None
    usage = anthropic.usage(started.done, result.finished.completion_tokens, written) | {
        "cache_creation": split
    }
    text, calls = plan.read(result.text)
    reply = anthropic.message(message_id, body.model, content(text, calls), result.finished, usage)
    return json_response(started, reply)
