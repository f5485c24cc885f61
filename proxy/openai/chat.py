"""``POST /v1/chat/completions``."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import TokenDelta
from proxy.http.auth import Tenant
from proxy.openai.logprobs import chat_logprobs
from proxy.openai.protocol import ChatCompletionRequest
from proxy.serving.ahead import chat_boundaries, render_ahead
from proxy.serving.prompts import chat_prompt_ids
from proxy.serving.running import complete, start
from proxy.serving.streaming import event_stream, json_response, new_id, now, sse_stream
from proxy.serving.validation import check_request, generation_request
from proxy.state import EngineDep, SettingsDep

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> Any:
    check_request(engine, body)
    messages, data = body.template_messages(), body.chat_template_kwargs

    def prompt() -> tuple[list[int], tuple[int, ...]]:
        ids = chat_prompt_ids(engine, body)
        return ids, chat_boundaries(engine, messages, ids, data)

    prompt_ids, boundaries = await run_in_threadpool(prompt)  # NOTE: big prompts take a while
    max_tokens = body.max_completion_tokens or body.max_tokens
    top = (body.top_logprobs or 0) if body.logprobs else 0
    generation = generation_request(engine, settings, tenant, body, prompt_ids, max_tokens, top)
    generation = dataclasses.replace(generation, boundaries=boundaries)
    started = await start(
        request, engine, generation, render_ahead(engine, settings, messages, generation, data)
    )
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
