"""``POST /v1/cache/prewarm``: compute and store a prompt's K/V without sampling anything.

The prompt is given as chat ``messages`` (rendered exactly as ``/v1/chat/completions`` renders
them, with the generation prompt unless ``add_generation_prompt`` is false) or as a ``prompt``
(text, tokenized as ``/v1/completions`` does, or token ids). Its full 128-token blocks are stored,
then its tail (the ``n mod 128`` tokens after them, ``hashing.tails``; not with ``--no-tails``).
The tenant comes from the API key, as for every request; the blocks and tail are indexed
(visible to every replica) when the answer comes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from hashing import BLOCK_SIZE
from proxy.cache_api.protocol import PrewarmRequest
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.openai.turns import prompt_ids
from proxy.serving.facts import served_model
from proxy.serving.running import store_prompt
from proxy.serving.validation import check_model, check_prompt_length
from proxy.state import CacheOnDep, EngineDep, SettingsDep

router = APIRouter()


@router.post("/v1/cache/prewarm")
async def prewarm(
    body: PrewarmRequest, engine: EngineDep, cache: CacheOnDep, settings: SettingsDep, tenant: Tenant
) -> dict[str, Any]:
    """Store the prompt's full blocks and tail; answer what was stored and what was already
    cached (blocks, and tokens: 128 per block, then the tail's)."""
    tokenizer, facts = served_model(engine)
    if body.model is not None:
        check_model(facts, body.model)
    ids = await run_in_threadpool(
        prompt_ids,
        tokenizer,
        facts.vocab_size,
        body.messages,
        body.prompt,
        body.add_generation_prompt,
        body.tools,
    )
    check_prompt_length(facts, len(ids), "messages" if body.messages is not None else "prompt")
    ttl = min(body.ttl or settings.ttl, settings.max_ttl)
    namespace = facts.namespace(tenant)
    before = await run_in_threadpool(cache.indexed_tokens, namespace, ids)
    if before is None:
        raise OpenAIError.cache_unavailable(": nothing was cached")
    if ids:  # NOTE: an empty prompt has nothing to store
        await store_prompt(engine, ids, tenant, ttl)
    after = await run_in_threadpool(cache.indexed_tokens, namespace, ids)
    if after is None:
        raise OpenAIError.cache_unavailable(": nothing was cached")
    cached, indexed = before[0] * BLOCK_SIZE + before[1], after[0] * BLOCK_SIZE + after[1]
    return {
        "object": "cache.prewarm",
        "model": facts.name,
        "prompt_tokens": len(ids),
        "stored_blocks": max(0, after[0] - before[0]),
        "stored_tokens": max(0, indexed - cached),
        "cached_blocks": before[0],
        "cached_tokens": cached,
        "tail_tokens": after[1],
        "uncached_tokens": len(ids) - max(indexed, cached),
        "ttl_s": ttl,
    }
