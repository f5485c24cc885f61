"""``POST /v1/messages``: Anthropic's Messages API on the local model, with prompt caching and
tools: the body is read once as a turn (``proxy.anthropic.turns``) and started by the core."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from proxy.anthropic import protocol as anthropic
from proxy.anthropic.caching import creation
from proxy.anthropic.limits import context_error
from proxy.anthropic.named import messages_body
from proxy.anthropic.streaming import events
from proxy.anthropic.tools import content
from proxy.anthropic.turns import check_body, messages_turn, system_role_refused
from proxy.config import Settings
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.http.warnings import warning_headers
from proxy.serving.facts import ModelFacts, served_model
from proxy.serving.prompts import layout, render_turn
from proxy.serving.starting import finish_turn, start_turn
from proxy.serving.streaming import event_stream, json_response, new_id
from proxy.serving.turn import Turn
from proxy.serving.validation import ContextExceeded, check_model
from proxy.state import EngineDep, SettingsDep

router = APIRouter()


def accept(facts: ModelFacts, body: anthropic.MessagesRequest, tenant: str, settings: Settings) -> Turn:
    """The body as a turn, once the server can serve it (run it off the event loop: it walks the
    tools' schemas); known client metadata left out unless ``--keep-client-metadata``.

    Raises:
        OpenAIError: 404 for a model not served, 400 naming a field that cannot be honoured.
    """
    check_model(facts, body.model)
    check_body(body)
    return messages_turn(body, tenant, keep_metadata=settings.keep_client_metadata)


@router.post("/v1/messages/count_tokens")
async def count_tokens(
    body: anthropic.CountTokensRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
    response: Response,
) -> dict[str, int]:
    """The prompt length of a Messages body, in tokens, as ``/v1/messages`` would render it (its
    breakpoints included: one the template cannot render is the same 400), with the same
    warning for tools left out of the prompt (``x-kvproxy-warning``)."""
    body = await messages_body(request, engine, body, tenant)
    tokenizer, facts = served_model(engine)
    turn = await run_in_threadpool(accept, facts, body, tenant, settings)

    def rendered() -> int:
        prompt = render_turn(tokenizer, facts.vocab_size, turn)
        layout(tokenizer, turn, prompt, settings.max_ttl)
        return len(prompt.ids)

    response.headers.update(warning_headers(turn.warnings))
    try:
        return {"input_tokens": await run_in_threadpool(rendered)}
    except OpenAIError as exc:
        if (refused := system_role_refused(body, exc)) is None:
            raise
        raise refused from exc


@router.post("/v1/messages")
async def messages(
    body: anthropic.MessagesRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> Any:
    body = await messages_body(request, engine, body, tenant)
    tokenizer, facts = served_model(engine)
    turn = await run_in_threadpool(accept, facts, body, tenant, settings)
    try:
        begun = await start_turn(turn, request, engine, tokenizer, facts, settings)
    except ContextExceeded as exc:
        raise context_error(exc) from None
    except OpenAIError as exc:
        if (refused := system_role_refused(body, exc)) is None:
            raise
        raise refused from exc
    started, message_id = begun.started, new_id("msg", "_")
    # NOTE: split as the client asked, whatever longer TTL the blocks are kept under (--client-ttl)
    split = creation(begun.asked_ttl, settings.ttl, started.done.cached_tokens, started.written)
    if body.stream:
        return event_stream(started, events(begun, message_id, body.model, split))
    answer = await finish_turn(begun, request)
    usage = anthropic.usage(answer.usage, split)
    blocks = content(answer.text, answer.calls)
    reply = anthropic.message(message_id, body.model, blocks, answer.finished, usage)
    return json_response(started, reply)
