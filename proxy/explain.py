"""Explained misses: why a prompt did (not) hit, in headers and, when asked, in detail.

Every response carries ``x-kvproxy-cache: hit|partial|miss`` and ``x-kvproxy-cached-tokens``.
With the request header ``x-kvproxy-explain: 1`` it also carries an explanation: in the JSON body
under ``kvproxy_cache_explanation``, or for a stream as the ``x-kvproxy-explain`` header (JSON).
Everything in it comes from the requester's own namespace: never another tenant's cache.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool

from engine.worker import Engine, PrefillDone
from hashing import BLOCK_SIZE
from proxy.metrics import cache_kind
from store.cache import BlockCache
from store.report import divergence

EXPLAIN_HEADER = "x-kvproxy-explain"
EXPLANATION_FIELD = "kvproxy_cache_explanation"
EXCERPT_TOKENS = 8


def cache_headers(done: PrefillDone) -> dict[str, str]:
    return {"x-kvproxy-cache": cache_kind(done), "x-kvproxy-cached-tokens": str(done.cached_tokens)}


def first_miss(done: PrefillDone) -> tuple[int | None, str | None]:
    """The first block not served from the cache and why: ``below one block``, ``partial last
    block``, or the lookup's reason (``never seen``, ``expired or evicted``, ``failed
    verification``, ``cache unavailable``, ``cache disabled``); ``(None, None)`` when every
    prompt token but the last came from the cache."""
    n, full = done.prompt_tokens, done.prompt_tokens // BLOCK_SIZE
    if full == 0:
        return 0, "below one block"
    if done.cached_blocks < full:
        return done.cached_blocks, done.miss_reason or "never seen"
    if n % BLOCK_SIZE:
        return full, "partial last block"
    return None, None


async def explain(
    engine: Engine, cache: BlockCache | None, tenant: str, prompt_ids: Sequence[int], done: PrefillDone
) -> dict[str, Any]:
    """The explanation of one request's cache outcome (see the module docstring)."""
    block, reason = first_miss(done)
    out: dict[str, Any] = {
        "cache": cache_kind(done),
        "prompt_tokens": done.prompt_tokens,
        "cached_tokens": done.cached_tokens,
        "prompt_blocks": done.prompt_tokens // BLOCK_SIZE,
        "blocks_matched": done.cached_blocks,
        "first_unmatched_block": block,
        "reason": reason,
        "divergence": None,
    }
    # NOTE: no divergence for block 0: comparing with an unrelated first block says nothing, and
    # would show text of other requests to a client that knows none of the prompt.
    skip = ("below one block", "partial last block", "cache unavailable")
    if cache is None or not block or reason in skip:
        return out
    found = await run_in_threadpool(divergence, cache, engine.namespace(tenant), prompt_ids, block)
    if found is not None:
        position, sibling = found
        cached_seq = list(prompt_ids[: block * BLOCK_SIZE]) + sibling
        span = slice(max(0, position - EXCERPT_TOKENS), position + EXCERPT_TOKENS)
        decode = engine.loaded.tokenizer.decode
        out["divergence"] = {
            "token_position": position,
            "cached": decode(cached_seq[span]),
            "prompt": decode(list(prompt_ids)[span]),
        }
    return out


def explanation_header(explanation: dict[str, Any]) -> str:
    """The explanation as one header value (compact, ASCII-only JSON)."""
    return json.dumps(explanation, separators=(",", ":"), ensure_ascii=True)
