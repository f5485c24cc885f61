"""``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (``alt=sse``):
Gemini's generation on the local model, with ``cachedContent`` naming a named cache whose
messages the prompt starts with (``proxy.named``).

``usageMetadata.cachedContentTokenCount`` counts the prompt tokens read from cached blocks (the
named cache's pinned ones, and any other prefix the cache holds).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import Failed, Finished, GenerationRequest, PrefillDone, TokenDelta
from engine.sampling import SamplingParams
from engine.worker import Engine
from proxy.config import Settings
from proxy.gemini.protocol import GenerateContentRequest, chat_messages, model_name, refuse_unsupported
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.named import service
from proxy.named.registry import NamedCaches
from proxy.serving.facts import served_model
from proxy.serving.running import Started, complete, start
from proxy.serving.streaming import event_stream, json_response, new_id, sse
from proxy.serving.validation import check_model, completion_budget
from proxy.state import EngineDep, SettingsDep

router = APIRouter()
NamedDep = Annotated[NamedCaches, Depends(service.get_named)]

FINISH_REASONS = {"stop": "STOP", "length": "MAX_TOKENS"}
"""kvproxy's finish reasons as Gemini's (anything else: ``OTHER``)."""


def usage(done: PrefillDone, completion_tokens: int) -> dict[str, int]:
    return {
        "promptTokenCount": done.prompt_tokens,
        "cachedContentTokenCount": done.cached_tokens,
        "candidatesTokenCount": completion_tokens,
        "totalTokenCount": done.prompt_tokens + completion_tokens,
    }


def reply(
    response_id: str, model: str, text: str, done: PrefillDone, finished: Finished | None
) -> dict[str, Any]:
    """A ``GenerateContentResponse`` with one candidate (a stream's chunk: ``finished`` None)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finished is not None:
        candidate["finishReason"] = FINISH_REASONS.get(finished.finish_reason, "OTHER")
    tokens = finished.completion_tokens if finished is not None else 0
    return {
        "candidates": [candidate],
        "usageMetadata": usage(done, tokens),
        "modelVersion": model,
        "responseId": response_id,
    }


async def prompt_messages(
    engine: Engine, named: NamedCaches, tenant: str, model: str, body: GenerateContentRequest
) -> list[dict[str, Any]]:
    """The body's prompt as chat messages, the named cache's first.

    Raises:
        OpenAIError: 404 for a model not served or a cache not found; 400 for a field the
            prompt cannot be made from.
    """
    check_model(served_model(engine).facts, model)
    refuse_unsupported(body)
    messages = chat_messages(body.system_instruction, body.contents)
    if not body.contents:
        raise OpenAIError(400, "contents: at least one content is required", param="contents")
    if body.cached_content is None:
        return messages
    return await service.with_cache(named, tenant, body.cached_content, model, messages, "cachedContent")


async def _generation(
    engine: Engine,
    settings: Settings,
    named: NamedCaches,
    tenant: str,
    model: str,
    body: GenerateContentRequest,
) -> GenerationRequest:
    """The body's prompt (``prompt_messages``) as a generation request.

    Raises:
        OpenAIError: as ``prompt_messages``; 400 for a prompt or ``maxOutputTokens`` past the
            context.
    """
    messages = await prompt_messages(engine, named, tenant, model, body)
    ids = await run_in_threadpool(service.rendered, engine.loaded.tokenizer, messages)
    config = body.generation_config
    return GenerationRequest(
        prompt_ids=tuple(ids),
        max_tokens=completion_budget(
            served_model(engine).facts, settings, len(ids), config.max_output_tokens, "contents"
        ),
        sampling=SamplingParams(
            temperature=1.0 if config.temperature is None else config.temperature,
            top_p=1.0 if config.top_p is None else config.top_p,
            seed=config.seed,
            presence_penalty=config.presence_penalty or 0.0,
            frequency_penalty=config.frequency_penalty or 0.0,
        ),
        stop=tuple(config.stop_sequences or ()),
        tenant=tenant,
    )


@router.post("/v1beta/models/{model}:generateContent")
@router.post("/v1beta/models/{model}:streamGenerateContent")
async def generate(
    model: str,
    body: GenerateContentRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    named: NamedDep,
    tenant: Tenant,
) -> Any:
    """The answer whole, or (``:streamGenerateContent``) as server-sent events, one
    ``GenerateContentResponse`` each (the SDK asks ``alt=sse``)."""
    name, response_id = model_name(model), new_id("gen")
    generation = await _generation(engine, settings, named, tenant, name, body)
    started = await start(request, engine, *served_model(engine), generation)
    if request.url.path.endswith(":streamGenerateContent"):
        return event_stream(started, _chunks(started, response_id, name))
    result = await complete(started, request)
    return json_response(started, reply(response_id, name, result.text, started.done, result.finished))


async def _chunks(started: Started, response_id: str, model: str) -> AsyncIterator[str]:
    running, done = started.running, started.done
    try:
        async for event in running:
            if isinstance(event, TokenDelta) and event.text:
                yield sse(reply(response_id, model, event.text, done, None))
            elif isinstance(event, Finished):
                yield sse(reply(response_id, model, event.text, done, event))
            elif isinstance(event, Failed):
                yield sse({"error": {"code": 500, "message": "internal server error", "status": "INTERNAL"}})
    finally:
        running.cancel()
