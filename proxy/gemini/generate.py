"""``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (``alt=sse``):
Gemini's generation on the local model, with ``cachedContent`` naming a named cache whose
messages the prompt starts with (``proxy.named``).

``usageMetadata.cachedContentTokenCount`` counts the prompt tokens read from cached blocks (the
named cache's pinned ones, and any other prefix the cache holds).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from engine.requests import Failed, Finished, TokenDelta
from proxy.gemini.answers import Candidate, GenerateContentResponse, UsageMetadata
from proxy.gemini.limits import context_error
from proxy.gemini.protocol import GenerateContentRequest, model_name
from proxy.gemini.turns import contents_messages, gemini_turn
from proxy.http.auth import Tenant
from proxy.named import service
from proxy.named.registry import NamedCaches
from proxy.named.service import NamedDep
from proxy.serving.facts import ModelFacts, served_model
from proxy.serving.starting import Begun, finish_turn, start_turn
from proxy.serving.streaming import event_stream, json_response, new_id, sse
from proxy.serving.turn import Usage
from proxy.serving.validation import ContextExceeded, check_model
from proxy.state import EngineDep, SettingsDep
from proxy.tools.rendering import TemplateMessage

router = APIRouter()

FINISH_REASONS = {"stop": "STOP", "length": "MAX_TOKENS"}
"""kvproxy's finish reasons as Gemini's (anything else: ``OTHER``)."""


def usage_metadata(counts: Usage) -> UsageMetadata:
    """A turn's counts as Gemini's ``usageMetadata``."""
    return {
        "promptTokenCount": counts.prompt_tokens,
        "cachedContentTokenCount": counts.cached_tokens,
        "candidatesTokenCount": counts.completion_tokens,
        "totalTokenCount": counts.total_tokens,
    }


def reply(
    response_id: str, model: str, text: str, counts: Usage, finished: Finished | None
) -> GenerateContentResponse:
    """A ``GenerateContentResponse`` with one candidate (a stream's chunk: ``finished`` None;
    ``counts`` the usage so far)."""
    candidate: Candidate = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finished is not None:
        candidate["finishReason"] = FINISH_REASONS.get(finished.finish_reason, "OTHER")
    return {
        "candidates": [candidate],
        "usageMetadata": usage_metadata(counts),
        "modelVersion": model,
        "responseId": response_id,
    }


async def prompt_messages(
    facts: ModelFacts, named: NamedCaches, tenant: str, model: str, body: GenerateContentRequest
) -> list[TemplateMessage]:
    """The body's prompt as chat messages, the named cache's first.

    Raises:
        OpenAIError: 404 for a model not served or a cache not found; 400 for a field the
            prompt cannot be made from.
    """
    check_model(facts, model)
    messages = contents_messages(body)
    if body.cached_content is None:
        return messages
    return await service.with_cache(named, tenant, body.cached_content, model, messages, "cachedContent")


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
    tokenizer, facts = served_model(engine)
    messages = await prompt_messages(facts, named, tenant, name, body)
    turn = gemini_turn(body, name, tenant, messages)
    try:
        begun = await start_turn(turn, request, engine, tokenizer, facts, settings)
    except ContextExceeded as exc:
        raise context_error(exc) from None
    if request.url.path.endswith(":streamGenerateContent"):
        return event_stream(begun.started, _chunks(begun, response_id, name))
    answer = await finish_turn(begun, request)
    return json_response(begun.started, reply(response_id, name, answer.raw, answer.usage, answer.finished))


async def _chunks(begun: Begun, response_id: str, model: str) -> AsyncIterator[str]:
    running = begun.started.running
    try:
        async for event in running:
            if isinstance(event, TokenDelta) and event.text:
                yield sse(reply(response_id, model, event.text, begun.usage(0), None))
            elif isinstance(event, Finished):
                yield sse(reply(response_id, model, event.text, begun.usage(event.completion_tokens), event))
            elif isinstance(event, Failed):
                yield sse({"error": {"code": 500, "message": "internal server error", "status": "INTERNAL"}})
    finally:
        running.cancel()
