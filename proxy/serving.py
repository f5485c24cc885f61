"""What chat and completions share: checks, running a request, and SSE streaming."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.generate import SamplingParams
from engine.worker import (
    Engine,
    EngineBusy,
    Failed,
    Finished,
    GenerationRequest,
    PrefillDone,
    RequestHandle,
    TokenDelta,
)
from proxy.config import Settings
from proxy.errors import OpenAIError
from proxy.explain import (
    EXPLAIN_HEADER,
    EXPLANATION_FIELD,
    cache_headers,
    explain,
    explanation_header,
    first_miss,
)
from proxy.protocol import SamplingFields, usage

DISCONNECT_POLL_S = 0.2

# Builds one response chunk from (text delta or None, the tokens it carries, finish_reason or None).
ChunkBuilder = Callable[[str | None, list[TokenDelta], str | None], dict[str, Any]]


@dataclass
class Completion:
    """A finished non-streaming completion."""

    text: str = ""
    finish_reason: str = "stop"
    tokens: list[TokenDelta] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)


def check_request(engine: Engine, body: SamplingFields) -> None:
    """404 for another model, 400 naming the first field this server cannot honour."""
    check_model(engine, body.model)
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")


def check_model(engine: Engine, name: str) -> None:
    """Raises a 404 ``model_not_found`` unless ``name`` is the served model."""
    if name != engine.loaded.name:
        raise OpenAIError(
            404,
            f"The model '{name}' does not exist; this server serves '{engine.loaded.name}'",
            param="model",
            code="model_not_found",
        )


RETENTION_S = {"24h": 86_400}


def generation_request(
    engine: Engine,
    settings: Settings,
    tenant: str,
    body: SamplingFields,
    prompt_ids: list[int],
    max_tokens: int | None,
    top_logprobs: int = 0,
) -> GenerationRequest:
    """Check lengths against the context and build the engine's request.

    The cache TTL is the server's (``prompt_cache_retention`` absent or ``"in_memory"``), or the
    requested retention capped at ``settings.max_ttl``.

    Raises:
        OpenAIError: empty prompt, or prompt + max_tokens over the model's context (400).
    """
    n = len(prompt_ids)
    if n == 0:
        raise OpenAIError(400, "the prompt is empty", param="prompt")
    context = engine.loaded.context_length
    if n >= context:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt alone has {n}.",
            param="messages" if hasattr(body, "messages") else "prompt",
            code="context_length_exceeded",
        )
    if max_tokens is None:  # NOTE: OpenAI's "up to the context", bounded by the server's default
        budget = min(context - n, settings.default_max_tokens)
    elif n + max_tokens > context:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt has {n} tokens "
            f"and {max_tokens} were requested for the completion.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    else:
        budget = max_tokens
    try:
        bias = body.token_bias(engine.loaded.model.config.vocab_size)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="logit_bias") from exc
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        max_tokens=budget,
        sampling=SamplingParams(
            temperature=temperature,
            top_p=top_p,
            seed=body.seed,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            logit_bias=tuple(bias.items()),
        ),
        stop=body.stop_strings(),
        top_logprobs=top_logprobs,
        tenant=tenant,
        cache_ttl_s=min(RETENTION_S.get(body.prompt_cache_retention or "", settings.ttl), settings.max_ttl),
    )


def submit(engine: Engine, request: GenerationRequest) -> RequestHandle:
    """Queue a request, or answer 503 with Retry-After when the engine is saturated."""
    try:
        return engine.submit(request)
    except EngineBusy:
        raise OpenAIError(
            503,
            "the server is busy; retry shortly",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": "1"},
        ) from None


@dataclass
class Started:
    """A request whose prompt is computed: its handle, the prefill outcome, the cache headers
    every response carries, and the explanation when the client asked for one."""

    handle: RequestHandle
    done: PrefillDone
    headers: dict[str, str]
    explanation: dict[str, Any] | None


async def start(request: Request, engine: Engine, generation: GenerationRequest) -> Started:
    """Submit a request and wait until its prompt is computed; record its metrics.

    A client that goes away meanwhile cancels the prefill.

    Raises:
        OpenAIError: 503 when the engine's queue is full; 499 when the client left.
    """
    handle = submit(engine, generation)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
    try:
        event = await handle.events.get()
    finally:
        watcher.cancel()
    if isinstance(event, Failed):
        raise event.error
    if not isinstance(event, PrefillDone):  # cancelled before its prompt was computed
        raise OpenAIError(499, "the client closed the request", code="client_closed_request")
    app = request.app.state
    namespace = engine.namespace(generation.tenant)
    app.metrics.observe(namespace.hex(), event, request.scope["state"]["started"], first_miss(event)[1])
    explanation = None
    if request.headers.get(EXPLAIN_HEADER) == "1":
        explanation = await explain(engine, app.cache, generation.tenant, generation.prompt_ids, event)
    return Started(handle, event, cache_headers(event), explanation)


def json_response(started: Started, body: dict[str, Any]) -> JSONResponse:
    """A finished completion: the cache headers, and the explanation in the body when asked."""
    if started.explanation is not None:
        body[EXPLANATION_FIELD] = started.explanation
    return JSONResponse(body, headers=started.headers)


def event_stream(started: Started, events: AsyncIterator[str]) -> StreamingResponse:
    """A streamed completion: the cache headers, and the explanation as a header when asked."""
    headers = started.headers
    if started.explanation is not None:
        headers = headers | {EXPLAIN_HEADER: explanation_header(started.explanation)}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def complete(started: Started, request: Request) -> Completion:
    """Wait for the whole completion; a client that goes away cancels the generation."""
    handle, done = started.handle, started.done
    watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
    result = Completion()
    parts: list[str] = []
    try:
        async for event in handle:
            if isinstance(event, TokenDelta):
                parts.append(event.text)
                result.tokens.append(event)
            elif isinstance(event, Finished):
                parts.append(event.text)
                result.text, result.finish_reason = "".join(parts), event.finish_reason
                result.usage = usage(done.prompt_tokens, event.completion_tokens, done.cached_tokens)
            elif isinstance(event, Failed):
                raise event.error
    finally:
        watcher.cancel()
        handle.cancel()  # no-op when finished; stops the worker if this task was cancelled
    return result


async def _cancel_on_disconnect(request: Request, handle: RequestHandle) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    handle.cancel()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def sse_stream(
    started: Started,
    chunk: ChunkBuilder,
    include_usage: bool,
    every_token: bool = False,
    first_text: str = "",
) -> AsyncIterator[str]:
    """Server-sent events of a streamed completion, ending with ``data: [DONE]``.

    A client that disconnects cancels this generator (Starlette cancels the response task), and
    with it the generation.

    Args:
        chunk: builds one chunk object.
        include_usage: send OpenAI's final usage chunk (empty ``choices``).
        every_token: one chunk per token even while its text is held back (for logprobs).
        first_text: text sent before the completion's (the prompt, for ``echo``).
    """
    handle, done = started.handle, started.done
    try:
        if first_text:
            yield _sse(chunk(first_text, [], None))
        async for event in handle:
            if isinstance(event, TokenDelta) and (event.text or every_token):
                yield _sse(chunk(event.text, [event], None))
            elif isinstance(event, Finished):
                if event.text:
                    yield _sse(chunk(event.text, [], None))
                yield _sse(chunk(None, [], event.finish_reason))
                if include_usage:
                    last = chunk(None, [], None) | {"choices": []}
                    last["usage"] = usage(done.prompt_tokens, event.completion_tokens, done.cached_tokens)
                    yield _sse(last)
            elif isinstance(event, Failed):
                error = {
                    "message": "internal server error",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
                yield _sse({"error": error})
    finally:
        handle.cancel()
    yield "data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def now() -> int:
    return int(time.time())
