"""``POST /v1/messages``: Anthropic's Messages API on the local model, with prompt caching."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine.requests import GenerationRequest
from engine.sampling import SamplingParams
from engine.worker import Engine
from proxy.anthropic import protocol as anthropic
from proxy.http.auth import Tenant, get_tenant
from proxy.http.errors import OpenAIError
from proxy.serving.ahead import chat_boundaries, render_ahead
from proxy.serving.rendering import RenderError, render_chat
from proxy.serving.running import complete, start
from proxy.serving.streaming import new_id
from proxy.serving.validation import check_model, completion_budget
from proxy.state import CacheDep, EngineDep, SettingsDep

router = APIRouter()


def prompt_and_ttls(
    engine: Engine, body: anthropic.MessagesRequest, max_ttl: int
) -> tuple[list[int], tuple[int | None, ...], tuple[int, ...]]:
    """The rendered prompt, the TTL plan its ``cache_control`` breakpoints give its blocks, and
    where later prompts may diverge from it (the breakpoints and the system prompt's end: a tail
    is stored at each, ``GenerationRequest.boundaries``).

    A breakpoint covers the message that holds it: its token position is the length of the
    prompt rendered up to that message, when that rendering is a prefix of the whole prompt
    (chat templates render turn after turn); else it covers the whole prompt.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    tokenizer = engine.loaded.tokenizer
    messages, breakpoints = body.template_messages()
    try:
        ids = render_chat(tokenizer, messages)
        positions = []
        for index, ttl in breakpoints:
            head = render_chat(tokenizer, messages[: index + 1], add_generation_prompt=False)
            positions.append((len(head) if ids[: len(head)] == head else len(ids), min(ttl, max_ttl)))
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc
    boundaries = {p for p, _ in positions} | set(chat_boundaries(engine, messages, ids, None))
    return ids, anthropic.breakpoint_ttls(len(ids), positions), tuple(sorted(boundaries))


def accept(engine: Engine, body: anthropic.MessagesRequest) -> None:
    """Raises OpenAIError: 404 for a model not served, 400 naming a field that cannot be honoured."""
    check_model(engine, body.model)
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")


@router.post("/v1/messages/count_tokens", dependencies=[Depends(get_tenant)])
async def count_tokens(
    body: anthropic.CountTokensRequest, engine: EngineDep, settings: SettingsDep
) -> dict[str, int]:
    """The prompt length of a Messages body, in tokens, as ``/v1/messages`` would render it."""
    accept(engine, body)
    ids, _, _ = await run_in_threadpool(prompt_and_ttls, engine, body, settings.max_ttl)
    return {"input_tokens": len(ids)}


@router.post("/v1/messages")
async def messages(
    body: anthropic.MessagesRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    cache: CacheDep,
    tenant: Tenant,
) -> Any:
    accept(engine, body)
    ids, ttls, boundaries = await run_in_threadpool(prompt_and_ttls, engine, body, settings.max_ttl)
    generation = GenerationRequest(
        prompt_ids=tuple(ids),
        max_tokens=completion_budget(engine, settings, len(ids), body.max_tokens, "messages"),
        sampling=SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
        ),
        stop=tuple(body.stop_sequences or ()),
        tenant=tenant,
        cache_ttl_s=ttls or None,
        boundaries=boundaries,
    )
    messages = body.template_messages()[0]
    started = await start(request, engine, generation, render_ahead(engine, settings, messages, generation))
    message_id = new_id("msg", "_")
    stored = anthropic.stored_end(len(ids), cache is not None, not settings.no_tails)
    if body.stream:
        stream = anthropic.events(started, message_id, body.model, stored)
        return StreamingResponse(stream, media_type="text/event-stream", headers=started.headers)
    result = await complete(started, request)
    assert result.finished is not None
    usage = anthropic.usage(started.done, result.finished.completion_tokens, stored)
    reply = anthropic.message(message_id, body.model, result.text, result.finished, usage)
    return JSONResponse(reply, headers=started.headers)
