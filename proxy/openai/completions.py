"""``POST /v1/completions``: prompt as a string or a list of token ids."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from engine.requests import TokenDelta
from proxy.http.auth import Tenant
from proxy.named.field import refuse_cached_content
from proxy.openai.limits import completion_context_error
from proxy.openai.logprobs import completion_logprobs
from proxy.openai.protocol import CompletionRequest, usage
from proxy.openai.replies import TextChoice, TextCompletion
from proxy.openai.streaming import sse_stream
from proxy.openai.turns import check_body, completion_turn
from proxy.serving.facts import served_model
from proxy.serving.starting import finish_turn, start_turn
from proxy.serving.streaming import event_stream, json_response, new_id, now
from proxy.serving.validation import ContextExceeded
from proxy.state import EngineDep, SettingsDep

router = APIRouter()


@router.post("/v1/completions")
async def completions(
    body: CompletionRequest,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    tenant: Tenant,
) -> Any:
    tokenizer, facts = served_model(engine)
    check_body(facts, body)
    refuse_cached_content(body)
    turn = completion_turn(body, settings, tenant)
    try:
        begun = await start_turn(turn, request, engine, tokenizer, facts, settings)
    except ContextExceeded as exc:
        raise completion_context_error(exc) from None
    started, ids = begun.started, begun.prompt.ids
    echoed = ""
    if body.echo:
        echoed = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(ids)
    completion_id, created = new_id("cmpl"), now()
    want_logprobs = body.logprobs is not None
    returned = 0  # characters of text sent so far: where the next token's text starts

    def chunk(text: str | None, tokens: list[TokenDelta], finish_reason: str | None) -> TextCompletion:
        nonlocal returned
        logprobs = completion_logprobs(tokenizer, tokens, returned) if want_logprobs and tokens else None
        returned += len(text or "")
        choice: TextChoice = {
            "index": 0,
            "text": text or "",
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "choices": [choice],
        }

    if body.stream:
        stream = sse_stream(started, chunk, body.include_usage, every_token=want_logprobs, first_text=echoed)
        return event_stream(started, stream)
    result = await finish_turn(begun, request)
    returned = len(echoed)  # the tokens' text follows the echoed prompt
    counts = result.usage
    shaped = usage(counts.prompt_tokens, counts.completion_tokens, counts.cached_tokens)
    response = chunk(echoed + result.raw, result.tokens, result.finish_reason)
    response["usage"] = shaped
    return json_response(started, response)
