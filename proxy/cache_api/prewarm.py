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
from starlette.concurrency import run_in_threadpool

from engine.requests import Failed, Finished, GenerationRequest, PrefillDone
from hashing import BLOCK_SIZE, num_full_blocks
from proxy.cache_api.protocol import PrewarmRequest
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.serving.prompts import prompt_ids
from proxy.serving.running import submit
from proxy.serving.validation import check_model, check_prompt_length
from proxy.state import CacheOnDep, EngineDep, SettingsDep

router = APIRouter()

FLUSH_TIMEOUT_S = 30.0
"""Most seconds the answer waits for the blocks to be stored and indexed."""


@router.post("/v1/cache/prewarm")
async def prewarm(
    body: PrewarmRequest, engine: EngineDep, cache: CacheOnDep, settings: SettingsDep, tenant: Tenant
) -> dict[str, Any]:
    """Store the prompt's full blocks; answer what was stored and what was already cached
    (blocks, and tokens: 128 per block)."""
    if body.model is not None:
        check_model(engine, body.model)
    ids = await run_in_threadpool(prompt_ids, engine, body.messages, body.prompt, body.add_generation_prompt)
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
        raise OpenAIError.cache_unavailable(": nothing was cached")
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
