"""``POST /v1/chat/completions``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import TokenDelta
from engine.worker import Engine
from proxy.config import Settings
from proxy.http.auth import Tenant
from proxy.openai.limits import chat_context_error
from proxy.openai.logprobs import chat_logprobs
from proxy.openai.named import chat_body
from proxy.openai.protocol import ChatCompletionRequest, usage
from proxy.openai.replies import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChunkChoice,
    ChunkDelta,
    ReplyMessage,
)
from proxy.openai.streaming import sse_stream
from proxy.openai.tools import delta
from proxy.openai.turns import CHAT_PARAMS, chat_answer, chat_turn, check_body
from proxy.serving.facts import served_model
from proxy.serving.starting import Begun, finish_turn, start_turn
from proxy.serving.streaming import event_stream, json_response, new_id, now
from proxy.serving.turn import Params
from proxy.serving.validation import ContextExceeded
from proxy.state import EngineDep, SettingsDep
from proxy.tools.spec import Piece

router = APIRouter()


async def start_chat(
    body: ChatCompletionRequest,
    request: Request,
    engine: Engine,
    settings: Settings,
    tenant: str,
    params: Params = CHAT_PARAMS,
    prompt_of: Callable[[list[int]], list[int]] | None = None,
    to_window: bool = False,
) -> Begun:
    """Check, translate and start a chat request: the one path of ``/v1/chat/completions`` and of
    ``/v1/responses`` (``proxy.responses``), so both compute the same prompt for one conversation.

    Args:
        params: the fields errors are named under.
        prompt_of: the prompt to compute for the chat's rendered ids (default: those ids).
        to_window: without a token limit, the answer may fill the context (``Turn.to_window``).

    Raises:
        OpenAIError: 400/404 naming the field the request cannot be served for; 503 when busy.
    """
    tokenizer, facts = served_model(engine)
    check_body(facts, body)
    answer = await run_in_threadpool(chat_answer, body)  # NOTE: walks the tools' schemas
    turn = chat_turn(body, settings, tenant, answer, params, prompt_of, to_window)
    return await start_turn(turn, request, engine, tokenizer, facts, settings)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> Any:
    body = await chat_body(request, engine, body, tenant)
    try:
        begun = await start_chat(body, request, engine, settings, tenant)
    except ContextExceeded as exc:
        field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        raise chat_context_error(exc, field) from None
    started, plan = begun.started, begun.plan
    completion_id, created = new_id("chatcmpl"), now()
    tokenizer = served_model(engine).tokenizer

    def logprobs(tokens: list[TokenDelta]) -> ChatLogprobs | None:
        return chat_logprobs(tokenizer, tokens) if body.logprobs and tokens else None

    def token_ids(choice: ChatChoice | ChunkChoice, tokens: list[TokenDelta]) -> None:
        if body.return_token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]

    if body.stream:
        sent_role, answer = False, plan.stream()

        def chunk(
            text: str | None, tokens: list[TokenDelta], finish_reason: str | None
        ) -> ChatCompletionChunk | None:
            nonlocal sent_role
            if finish_reason is None:
                pieces = answer.feed(text) if text is not None else []
            else:
                pieces, calls = answer.finish("")
                finish_reason = "tool_calls" if calls and finish_reason == "stop" else finish_reason
            fields = merged(pieces)
            if text is not None and not fields and sent_role and not body.logprobs:
                return None  # NOTE: held back (a call's text until it parses): nothing to say
            if not sent_role:
                fields["role"], sent_role = "assistant", True
            choice: ChunkChoice = {
                "index": 0,
                "delta": fields,
                "logprobs": logprobs(tokens),
                "finish_reason": finish_reason,
            }
            token_ids(choice, tokens)
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.model,
                "choices": [choice],
            }

        stream = sse_stream(started, chunk, body.include_usage, every_token=body.logprobs)
        return event_stream(started, stream)

    result = await finish_turn(begun, request)
    content, calls = result.text, result.calls
    message: ReplyMessage = {"role": "assistant", "content": content or None if calls else content}
    finish_reason: str = result.finish_reason
    if calls:
        message["tool_calls"] = [call.as_openai() for call in calls]
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    choice: ChatChoice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs(result.tokens),
        "finish_reason": finish_reason,
    }
    token_ids(choice, result.tokens)
    counts = result.usage
    response: ChatCompletion = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": body.model,
        "choices": [choice],
        "usage": usage(counts.prompt_tokens, counts.completion_tokens, counts.cached_tokens),
    }
    return json_response(started, response)


def merged(pieces: list[Piece]) -> ChunkDelta:
    """Pieces of a streamed answer as one chunk's ``delta`` (calls merged by index)."""
    fields: ChunkDelta = {}
    for piece in pieces:
        part = delta(piece)
        if "content" in part:
            fields["content"] = fields.get("content", "") + part["content"]
        for call in part.get("tool_calls", []):
            calls = fields.setdefault("tool_calls", [])
            same = next((c for c in calls if c["index"] == call["index"]), None)
            if same is None:
                calls.append(call)
            else:
                same["function"]["arguments"] += call["function"]["arguments"]
    return fields
