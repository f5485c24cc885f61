"""``POST /v1/cache/prewarm``: compute and store a prompt's full blocks without sampling anything.

The prompt is given as chat ``messages`` (rendered exactly as ``/v1/chat/completions`` renders
them, with the generation prompt unless ``add_generation_prompt`` is false) or as a ``prompt``
(text, tokenized as ``/v1/completions`` does, or token ids). Only full 128-token blocks are ever
stored, so the last ``n mod 128`` tokens are not computed. The tenant comes from the API key, as
for every request; the blocks are indexed (visible to every replica) when the answer comes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field, StrictInt, model_validator
from starlette.concurrency import run_in_threadpool

from engine.requests import Failed, Finished, GenerationRequest, PrefillDone
from engine.worker import Engine
from hashing import BLOCK_SIZE, num_full_blocks
from proxy.auth import Tenant
from proxy.errors import OpenAIError
from proxy.protocol import ChatMessage
from proxy.rendering import RenderError, render_messages
from proxy.routes.completions import prompt_ids as completion_prompt_ids
from proxy.running import submit
from proxy.state import CacheDep, EngineDep, SettingsDep
from proxy.validation import check_model, check_prompt_length

router = APIRouter()

FLUSH_TIMEOUT_S = 30.0
"""Most seconds the answer waits for the blocks to be stored and indexed."""


class PrewarmRequest(BaseModel):
    """A prompt to cache: ``messages`` or ``prompt`` (exactly one)."""

    model: str | None = Field(None, description="Checked against the served model when given.")
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    prompt: str | list[StrictInt] | None = None
    add_generation_prompt: bool = Field(
        True, description="Render messages with the assistant's generation prompt, as chat does."
    )
    ttl: StrictInt | None = Field(
        None, gt=0, description="Seconds the blocks stay cached after their last hit (capped at --max-ttl)."
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> PrewarmRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of `messages` and `prompt`")
        return self


def prompt_ids(engine: Engine, body: PrewarmRequest) -> list[int]:
    """The prompt's token ids, as the chat or completions route would compute them.

    Raises:
        OpenAIError: a message the chat template cannot render; a token id outside the vocabulary.
    """
    if body.messages is not None:
        try:
            return render_messages(
                engine.loaded.tokenizer, body.messages, add_generation_prompt=body.add_generation_prompt
            )
        except RenderError as exc:
            raise OpenAIError(400, exc.message, param=exc.param) from exc
    return completion_prompt_ids(engine, body.prompt or [])


@router.post("/v1/cache/prewarm")
async def prewarm(
    body: PrewarmRequest, engine: EngineDep, cache: CacheDep, settings: SettingsDep, tenant: Tenant
) -> dict[str, Any]:
    """Store the prompt's full blocks; answer what was stored and what was already cached
    (blocks, and tokens: 128 per block)."""
    if cache is None:
        raise OpenAIError(400, "caching is off on this server (--no-cache)", code="cache_disabled")
    if body.model is not None:
        check_model(engine, body.model)
    ids = await run_in_threadpool(prompt_ids, engine, body)
    check_prompt_length(engine, len(ids), "messages" if body.messages is not None else "prompt")
    blocks = num_full_blocks(len(ids))
    ttl = min(body.ttl or settings.ttl, settings.max_ttl)
    cached = 0
    if blocks:
        full = tuple(ids[: blocks * BLOCK_SIZE])
        request = GenerationRequest(full, max_tokens=1, tenant=tenant, cache_ttl_s=ttl, prewarm=True)
        async for event in submit(engine, request):
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Finished) and event.finish_reason == "cancelled":
                raise OpenAIError(503, "the prewarm was cancelled", type="server_error")
            if isinstance(event, PrefillDone):
                cached = event.cached_blocks
        await run_in_threadpool(engine.flush_saves, FLUSH_TIMEOUT_S)
    namespace = engine.loaded.namespace(tenant)
    indexed = await run_in_threadpool(cache.indexed_blocks, namespace, ids[: blocks * BLOCK_SIZE])
    if indexed is None:
        raise OpenAIError(
            503, "Redis is unreachable: nothing was cached", type="server_error", code="cache_unavailable"
        )
    stored = max(0, indexed - cached)
    return {
        "object": "cache.prewarm",
        "model": engine.loaded.name,
        "prompt_tokens": len(ids),
        "stored_blocks": stored,
        "stored_tokens": stored * BLOCK_SIZE,
        "cached_blocks": cached,
        "cached_tokens": cached * BLOCK_SIZE,
        "uncached_tokens": len(ids) - (cached + stored) * BLOCK_SIZE,
        "ttl_s": ttl,
    }
