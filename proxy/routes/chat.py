"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import TokenDelta
from engine.worker import Engine
from proxy.auth import Tenant
from proxy.errors import OpenAIError
from proxy.logprobs import chat_logprobs
from proxy.protocol import ChatCompletionRequest
from proxy.rendering import RenderError, render_chat
from proxy.running import complete, start
from proxy.state import EngineDep, SettingsDep
from proxy.streaming import event_stream, json_response, new_id, now, sse_stream
from proxy.validation import check_request, generation_request

router = APIRouter()


def render_prompt(engine: Engine, body: ChatCompletionRequest) -> list[int]:
    """The chat rendered with the generation prompt, as token ids (``proxy.rendering``).

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    try:
        return render_chat(engine.loaded.tokenizer, body.template_messages())
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> Any:
    check_request(engine, body)
    prompt_ids = await run_in_threadpool(render_prompt, engine, body)  # NOTE: big prompts take a while
    max_tokens = body.max_completion_tokens or body.max_tokens
    top = (body.top_logprobs or 0) if body.logprobs else 0
    generation = generation_request(engine, settings, tenant, body, prompt_ids, max_tokens, top)
    started = await start(request, engine, generation)
    completion_id, created = new_id("chatcmpl"), now()

    def logprobs(tokens: list[TokenDelta]) -> dict[str, Any] | None:
        return chat_logprobs(engine.loaded.tokenizer, tokens) if body.logprobs and tokens else None

    if body.stream:
        sent_role = False

        def chunk(text: str | None, tokens: list[TokenDelta], finish_reason: str | None) -> dict[str, Any]:
            nonlocal sent_role
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if not sent_role:
                delta["role"], sent_role = "assistant", True
            choice = {
                "index": 0,
                "delta": delta,
                "logprobs": logprobs(tokens),
                "finish_reason": finish_reason,
            }
            if body.return_token_ids:
                choice["token_ids"] = [t.token_id for t in tokens]
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.model,
                "choices": [choice],
            }

        stream = sse_stream(started, chunk, body.include_usage, every_token=body.logprobs)
        return event_stream(started, stream)

    result = await complete(started, request)
    message = {"role": "assistant", "content": result.text}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs(result.tokens),
        "finish_reason": result.finish_reason,
    }
    if body.return_token_ids:
        choice["token_ids"] = [t.token_id for t in result.tokens]
    response = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": body.model,
        "choices": [choice],
        "usage": result.usage,
    }
    return json_response(started, response)
