"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``: OpenAI's Responses API on the local model.

A response is computed as the chat completion of its conversation (``proxy.responses.protocol``):
the instructions, then, with ``previous_response_id``, the stored conversation through that
response's output, then this request's input. With ``store`` (the default) it is kept in Redis
(``proxy.responses.state``), under the caller's tenant.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from engine.requests import Finished
from proxy.config import state_place
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError, on_redis
from proxy.named.field import refuse_cached_content
from proxy.openai.chat import start_chat
from proxy.openai.protocol import ChatCompletionRequest
from proxy.responses.continuation import continuation
from proxy.responses.events import events
from proxy.responses.history import chat_messages, check_calls
from proxy.responses.items import input_items, output_items
from proxy.responses.limits import context_ended, context_error, ended_error, failed_error, refused_stream
from proxy.responses.protocol import (
    UNSUPPORTED,
    ResponsesRequest,
    responses_left_out,
    responses_param,
    usage,
)
from proxy.responses.replies import OutputItem, ResponseObject
from proxy.responses.state import ResponsesDep, ResponseStore, StoredResponse
from proxy.responses.tools import ToolPlan, add_warning, tool_plan
from proxy.serving.facts import served_model
from proxy.serving.starting import Begun, finish_turn
from proxy.serving.streaming import event_stream, json_response, new_id, now
from proxy.serving.turn import Params
from proxy.serving.validation import ContextExceeded
from proxy.state import EngineDep, SettingsDep
from proxy.tools.rendering import TemplateMessage
from store.index.redis.connect import REDIS_ERRORS
from store.index.redis.faults import redis_fault

log = logging.getLogger(__name__)
router = APIRouter()
PARAMS = Params("messages", "tools[{i}].parameters", "text.format.schema")
"""Where a bad prompt, a bad tool schema and a bad answer schema are reported (the prompt's
field as the chat's: ``responses_param`` names it as this request's)."""


async def stored(
    responses: ResponseStore, tenant: str, response_id: str, param: str | None
) -> StoredResponse:
    """The tenant's stored response ``response_id``.

    Raises:
        OpenAIError: 404 when this tenant has no such response (another tenant's id included),
            saying so when it expired or was evicted; 503 when Redis is unreachable.
    """
    found = await on_redis(
        responses.get, tenant, response_id, detail=lambda exc: f": stored responses cannot be read ({exc})"
    )
    code = "previous_response_not_found" if param else "response_not_found"
    if found == "gone":
        message = (
            f"Response '{response_id}' expired or was evicted from the response store "
            "(--responses-ttl, --responses-max-bytes)"
        )
        raise OpenAIError(404, message, param=param, code=code)
    if found is None:
        raise OpenAIError(404, f"No response found with id '{response_id}'.", param=param, code=code)
    return found


def skeleton(response_id: str, body: ResponsesRequest) -> ResponseObject:
    """The response object before its output: ``status`` in progress."""
    text = body.text if body.text and body.text.get("format") else {"format": {"type": "text"}}
    return {
        "id": response_id,
        "object": "response",
        "created_at": now(),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": text,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.echoed_tools(),
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "metadata": body.metadata or {},
    }


async def start_response(
    body: ResponsesRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: str,
    messages: list[TemplateMessage],
    previous: StoredResponse | None,
    tools: ToolPlan,
) -> tuple[ChatCompletionRequest, Begun]:
    """Start the chat completion of ``messages`` with the functions ``tools`` offers (continuing
    ``previous``'s stored ids), errors named as the Responses request names its fields."""
    after = previous.continuation if previous is not None else None
    try:
        chat = body.chat_request(messages, tools)
        prompt_of = after.prompt if after is not None else None
        turn = await start_chat(chat, request, engine, settings, tenant, PARAMS, prompt_of, True)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = tools.param(responses_param(".".join(str(p) for p in first.get("loc", ())) or None))
        raise OpenAIError(400, f"{param}: {first.get('msg')}", param=param) from None
    except OpenAIError as exc:
        exc.param = tools.param(responses_param(exc.param))
        if exc.param == "tool_choice" and tools.left_out and not tools.chat:
            exc.message += f"; {tools.warning()}"
        raise
    if (explanation := turn.started.explanation) is not None and explanation.left_out:
        left_out = responses_left_out(explanation.left_out, bool(body.instructions))
        turn.started.explanation = dataclasses.replace(explanation, left_out=left_out)
    return chat, turn


@router.post("/v1/responses")
async def create(
    body: ResponsesRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
    responses: ResponsesDep,
) -> Any:
    refuse_cached_content(body)
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        code = "unsupported_parameter" if param in UNSUPPORTED else None
        raise OpenAIError(400, reason, param=param, code=code)
    tools = tool_plan(body.tools)
    previous = None
    if body.previous_response_id is not None:
        previous = await stored(responses, tenant, body.previous_response_id, "previous_response_id")
    items = input_items(body.input)
    history = previous.conversation if previous is not None else []
    check_calls(history, items)
    system = body.system_messages()
    try:
        chat, turn = await start_response(
            body, request, engine, settings, tenant, system + history + chat_messages(items), previous, tools
        )
    except ContextExceeded as exc:
        if body.stream:  # NOTE: in the stream, where clients that compact look for it
            return refused_stream(skeleton(new_id("resp", "_"), body), context_error(exc))
        raise context_error(exc) from None
    response, served = skeleton(new_id("resp", "_"), body), served_model(engine)
    add_warning(turn.started.headers, tools)
    window = served.facts.context_length

    def ended(finished: Finished) -> bool:
        counts = turn.started.usage(finished.completion_tokens)
        return context_ended(finished, counts, window, body.max_output_tokens)

    async def finish(
        output: list[OutputItem], finished: Finished, generated: list[int], text: str
    ) -> ResponseObject:
        if ended(finished):
            counts = turn.started.usage(finished.completion_tokens)
            error = failed_error(counts, window)
            return response | {
                "status": "failed",
                "error": error,
                "usage": usage(counts),
                "completed_at": now(),
            }
        whole = finished.finish_reason != "length"
        response["status"] = "completed" if whole else "incomplete"
        response["incomplete_details"] = None if whole else {"reason": "max_output_tokens"}
        response["output"] = output
        response["completed_at"] = now()
        response["usage"] = usage(turn.started.usage(finished.completion_tokens))
        if body.store:
            conversation = history + chat_messages([*items, *output])
            after = await run_in_threadpool(
                continuation,
                served.tokenizer,
                served.facts.vocab_size,
                system + conversation,
                chat.tools,
                turn.prompt.rendered,
                turn.prompt.ids,
                generated,
                text,
            )
            try:
                await run_in_threadpool(
                    responses.put, tenant, StoredResponse(response, items, conversation, after)
                )
            except REDIS_ERRORS as exc:
                place = state_place(settings)
                log.warning("response %s was not stored: %s", response["id"], redis_fault(exc, place))
        return response

    if body.stream:
        streamed = events(turn.started, turn.plan, response.copy(), finish, tools, ended)
        return event_stream(turn.started, streamed)
    result = await finish_turn(turn, request)
    if ended(result.finished):
        raise ended_error(result.usage, window)
    output = output_items(result.text, result.calls, result.finish_reason != "length", tools)
    generated = [t.token_id for t in result.tokens]
    return json_response(turn.started, await finish(output, result.finished, generated, result.raw))


@router.get("/v1/responses/{response_id}")
async def get(response_id: str, tenant: Tenant, responses: ResponsesDep) -> dict[str, Any]:
    return dict((await stored(responses, tenant, response_id, None)).response)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, tenant: Tenant, responses: ResponsesDep) -> dict[str, Any]:
    await stored(responses, tenant, response_id, None)
    await on_redis(
        responses.delete, tenant, response_id, detail=lambda exc: f": the response cannot be deleted ({exc})"
    )
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    tenant: Tenant,
    responses: ResponsesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The items of the response's input, as OpenAI pages them (newest first by default)."""
    items = (await stored(responses, tenant, response_id, None)).input_items
    items = items[::-1] if order == "desc" else items
    ids = [item["id"] for item in items]
    if after is not None:
        if after not in ids:
            raise OpenAIError(400, f"no input item '{after}' in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
