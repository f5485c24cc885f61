"""``POST /v1/chat/completions``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import TokenDelta
from engine.worker import Engine
from proxy.config import Settings
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.openai.logprobs import chat_logprobs
from proxy.openai.named import chat_body
from proxy.openai.protocol import ChatCompletionRequest
from proxy.openai.tools import answer_schema, chat_tools, delta
from proxy.serving.ahead import chat_boundaries, render_ahead
from proxy.serving.prompts import ChatPrompt, chat_prompt
from proxy.serving.running import Started, complete, start
from proxy.serving.streaming import event_stream, json_response, new_id, now, sse_stream
from proxy.serving.validation import check_request, generation_request
from proxy.state import EngineDep, SettingsDep
from proxy.tools.answer import AnswerPlan, plan_answer
from proxy.tools.prompt import tools_span
from proxy.tools.spec import Piece

router = APIRouter()


@dataclasses.dataclass(frozen=True)
class ChatTurn:
    """A chat request whose prompt is computed: the prompt, how its answer is read (text,
    calls), the running request, and the ids the chat template rendered (``prompt.ids`` unless
    ``start_chat``'s ``prompt_of`` changed them)."""

    prompt: ChatPrompt
    plan: AnswerPlan
    started: Started
    rendered: list[int]


async def start_chat(
    body: ChatCompletionRequest,
    request: Request,
    engine: Engine,
    settings: Settings,
    tenant: str,
    params: tuple[str, str] = ("response_format.json_schema.schema", "tools[{i}].function.parameters"),
    prompt_of: Callable[[list[int]], list[int]] | None = None,
) -> ChatTurn:
    """Check, render and start a chat request: the one path of ``/v1/chat/completions`` and of
    ``/v1/responses`` (``proxy.responses``), so both compute the same prompt for one conversation.

    Args:
        params: the fields a bad answer schema and a bad tool schema are reported under.
        prompt_of: the prompt to compute for the chat's rendered ids (default: those ids).

    Raises:
        OpenAIError: 400/404 naming the field the request cannot be served for; 503 when busy.
    """
    check_request(engine, body)
    # NOTE: off the event loop: the schema walks are linear and bounded, but a body holds megabytes
    tools, schema = await run_in_threadpool(lambda: (chat_tools(body), answer_schema(body)))
    if schema is not None and tools is not None and tools.mode != "none":
        raise OpenAIError(
            400,
            "response_format with callable tools is not supported; send one or the other",
            param="response_format",
        )

    def prepare() -> tuple[ChatPrompt, list[int], tuple[int, ...], AnswerPlan]:
        prompt = rendered = chat_prompt(engine, body, tools)
        if prompt_of is not None:
            prompt = dataclasses.replace(prompt, ids=prompt_of(prompt.ids))
        boundaries = chat_boundaries(engine, prompt.messages, prompt.ids, prompt.data, prompt.tools)
        return prompt, rendered.ids, boundaries, plan_answer(engine, tools, schema, *params)

    prompt, rendered, boundaries, plan = await run_in_threadpool(prepare)  # NOTE: big prompts take a while
    max_tokens = body.max_completion_tokens or body.max_tokens
    top = (body.top_logprobs or 0) if body.logprobs else 0
    generation = generation_request(engine, settings, tenant, body, prompt.ids, max_tokens, top)
    generation = dataclasses.replace(generation, boundaries=boundaries, grammar=plan.grammar)
    ahead = render_ahead(engine, settings, prompt.messages, generation, prompt.data, prompt.tools)
    span = None
    if tools is not None:
        tokenizer, fmt, raw = engine.loaded.tokenizer, plan.format, body.template_messages()
        span = partial(tools_span, tokenizer, raw, tools, fmt, prompt.ids, prompt.data)
    return ChatTurn(prompt, plan, await start(request, engine, generation, ahead, span), rendered)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> Any:
    body = await chat_body(request, engine, body, tenant)
    turn = await start_chat(body, request, engine, settings, tenant)
    started, plan = turn.started, turn.plan
    completion_id, created = new_id("chatcmpl"), now()

    def logprobs(tokens: list[TokenDelta]) -> dict[str, Any] | None:
        return chat_logprobs(engine.loaded.tokenizer, tokens) if body.logprobs and tokens else None

    def choice_of(
        fields: dict[str, Any], tokens: list[TokenDelta], finish_reason: str | None
    ) -> dict[str, Any]:
        choice = fields | {"logprobs": logprobs(tokens), "finish_reason": finish_reason}
        if body.return_token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]
        return {"index": 0} | choice

    if body.stream:
        sent_role, answer = False, plan.stream()

        def chunk(
            text: str | None, tokens: list[TokenDelta], finish_reason: str | None
        ) -> dict[str, Any] | None:
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
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.model,
                "choices": [choice_of({"delta": fields}, tokens, finish_reason)],
            }

        stream = sse_stream(started, chunk, body.include_usage, every_token=body.logprobs)
        return event_stream(started, stream)

    result = await complete(started, request)
    content, calls = plan.read(result.text)
    message: dict[str, Any] = {"role": "assistant", "content": content or None if calls else content}
    finish_reason = result.finish_reason
    if calls:
        message["tool_calls"] = [call.as_openai() for call in calls]
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    response = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": body.model,
        "choices": [choice_of({"message": message}, result.tokens, finish_reason)],
        "usage": result.usage,
    }
    return json_response(started, response)


def merged(pieces: list[Piece]) -> dict[str, Any]:
    """Pieces of a streamed answer as one chunk's ``delta`` (calls merged by index)."""
    fields: dict[str, Any] = {}
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
