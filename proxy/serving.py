"""What chat and completions share: checks, running a request, and SSE streaming."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

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
from proxy.errors import OpenAIError
from proxy.protocol import SamplingFields, usage


@dataclass
class Completion:
    """A finished non-streaming completion."""

    text: str
    finish_reason: str
    usage: dict[str, Any]


def check_model(engine: Engine, name: str) -> None:
    """Raises a 404 ``model_not_found`` unless ``name`` is the served model."""
    if name != engine.loaded.name:
        raise OpenAIError(
            404,
            f"The model '{name}' does not exist; this server serves '{engine.loaded.name}'",
            param="model",
            code="model_not_found",
        )


def generation_request(
    engine: Engine, body: SamplingFields, prompt_ids: list[int], max_tokens: int | None
) -> GenerationRequest:
    """Check lengths against the context and build the engine's request.

    Raises:
        OpenAIError: empty prompt, or prompt + max_tokens over the model's context (400).
    """
    n = len(prompt_ids)
    if n == 0:
        raise OpenAIError(400, "the prompt is empty", param="prompt")
    context = engine.loaded.context_length
    budget = context - n if max_tokens is None else max_tokens
    if n + budget > context or budget < 1:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt has {n} tokens "
            f"and {budget} were requested for the completion.",
            param="max_tokens" if max_tokens is not None else "messages",
            code="context_length_exceeded",
        )
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        max_tokens=budget,
        sampling=SamplingParams(temperature=temperature, top_p=top_p, seed=body.seed),
        stop=body.stop_strings(),
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


async def complete(handle: RequestHandle) -> Completion:
    """Wait for the whole completion."""
    parts: list[str] = []
    prompt_tokens = cached_tokens = 0
    try:
        async for event in handle:
            if isinstance(event, PrefillDone):
                prompt_tokens, cached_tokens = event.prompt_tokens, event.cached_tokens
            elif isinstance(event, TokenDelta):
                parts.append(event.text)
            elif isinstance(event, Finished):
                parts.append(event.text)
                return Completion(
                    "".join(parts),
                    event.finish_reason,
                    usage(prompt_tokens, event.completion_tokens, cached_tokens),
                )
            elif isinstance(event, Failed):
                raise event.error
    finally:
        handle.cancel()  # no-op when finished; stops the worker if this task was cancelled
    raise AssertionError("event stream ended without Finished")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def sse_stream(
    handle: RequestHandle,
    chunk: Callable[[str | None, str | None], dict[str, Any]],
    include_usage: bool,
) -> AsyncIterator[str]:
    """Server-sent events of a streamed completion, ending with ``data: [DONE]``.

    Args:
        chunk: builds one chunk object from ``(text delta or None, finish_reason or None)``.
        include_usage: send OpenAI's final usage chunk (empty ``choices``).
    """
    prompt_tokens = cached_tokens = 0
    try:
        async for event in handle:
            if isinstance(event, PrefillDone):
                prompt_tokens, cached_tokens = event.prompt_tokens, event.cached_tokens
            elif isinstance(event, TokenDelta) and event.text:
                yield _sse(chunk(event.text, None))
            elif isinstance(event, Finished):
                if event.text:
                    yield _sse(chunk(event.text, None))
                yield _sse(chunk(None, event.finish_reason))
                if include_usage:
                    last = chunk(None, None) | {"choices": []}
                    last["usage"] = usage(prompt_tokens, event.completion_tokens, cached_tokens)
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
