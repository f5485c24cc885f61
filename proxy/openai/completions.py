"""``POST /v1/completions``: prompt as a string or a list of token ids."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.requests import TokenDelta
from proxy.http.auth import Tenant
from proxy.named.field import refuse_cached_content
from proxy.openai.logprobs import completion_logprobs
from proxy.openai.protocol import CompletionRequest
from proxy.serving.prompts import completion_prompt_ids
from proxy.serving.running import complete, start
from proxy.serving.streaming import event_stream, json_response, new_id, now, sse_stream
from proxy.serving.validation import check_request, generation_request
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
    check_request(engine, body)
    refuse_cached_content(body)
    top = body.logprobs or 0
    ids = await run_in_threadpool(
        completion_prompt_ids, engine, body.prompt
    )  # NOTE: big prompts take a while
    generation = generation_request(engine, settings, tenant, body, ids, body.max_tokens, top)
    started = await start(request, engine, generation)
    echoed = ""
    if body.echo:
        echoed = body.prompt if isinstance(body.prompt, str) else engine.loaded.tokenizer.decode(ids)
    completion_id, created = new_id("cmpl"), now()
    want_logprobs = body.logprobs is not None
    tokenizer = engine.loaded.tokenizer
    returned = 0  # characters of text sent so far: where the next token's text starts

    def chunk(text: str | None, tokens: list[TokenDelta], finish_reason: str | None) -> dict[str, Any]:
        nonlocal returned
        logprobs = completion_logprobs(tokenizer, tokens, returned) if want_logprobs and tokens else None
        returned += len(text or "")
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
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
    result = await complete(started, request)
    returned = len(echoed)  # the tokens' text follows the echoed prompt
    response = chunk(echoed + result.text, result.tokens, result.finish_reason) | {"usage": result.usage}
    return json_response(started, response)
