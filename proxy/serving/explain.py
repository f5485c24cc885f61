"""Explained misses: why a prompt did (not) hit, in headers and, when asked, in detail.

Every response carries ``x-kvproxy-cache: hit|partial|miss``, ``x-kvproxy-cached-tokens`` and
``x-kvproxy-tail-tokens`` (those of the cached tokens a tail served, ``hashing.tails``; the rest
came from whole blocks).
With the request header ``x-kvproxy-explain: 1`` it also carries an explanation: in the JSON body
under ``kvproxy_cache_explanation``, or for a stream as the ``x-kvproxy-explain`` header (JSON).
Everything in it comes from the requester's own namespace: never another tenant's cache.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from engine.requests import PrefillDone
from hashing import BLOCK_SIZE, num_full_blocks
from proxy.serving.facts import ModelFacts
from proxy.serving.metadata import LeftOut
from store.admin_interface import CacheAdmin
from store.outcomes import CacheKind, MissReason

EXPLAIN_HEADER = "x-kvproxy-explain"
EXPLANATION_FIELD = "kvproxy_cache_explanation"
EXCERPT_TOKENS = 8
TOOLS_CHANGED = "tools changed"
"""The reason of a miss whose first differing token is in the tool definitions."""

# NOTE: no divergence for these: nothing was compared, the cache could not be asked, or its blobs
# could not be read in time (reading a sibling would wait on the same disk again).
_NOTHING_TO_COMPARE = (
    MissReason.BELOW_ONE_BLOCK,
    MissReason.PARTIAL_LAST_BLOCK,
    MissReason.UNAVAILABLE,
    MissReason.TIMED_OUT,
    MissReason.READ_FAILED,
)


def cache_headers(done: PrefillDone) -> dict[str, str]:
    return {
        "x-kvproxy-cache": done.kind,
        "x-kvproxy-cached-tokens": str(done.cached_tokens),
        "x-kvproxy-tail-tokens": str(done.tail_tokens),
    }


@dataclass(frozen=True)
class Divergence:
    """Where the prompt first differs from what the cache holds after the matched blocks: the
    token position, and text around it on each side (the cached side's None when withheld)."""

    token_position: int
    cached: str | None
    prompt: str


@dataclass(frozen=True)
class Explanation:
    """One request's cache outcome, explained (its JSON: ``as_json``, keys in this order);
    ``left_out``: the client metadata left out of the prompt (``proxy.serving.metadata``), each as
    ``{"rule": ..., "param": ...}``."""

    cache: CacheKind
    prompt_tokens: int
    cached_tokens: int
    prompt_blocks: int
    blocks_matched: int
    block_tokens: int
    tail_tokens: int
    first_unmatched_block: int | None
    reason: MissReason | str | None
    divergence: Divergence | None
    load_seconds: float
    prefill_seconds: float
    left_out: tuple[LeftOut, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def explain(
    tokenizer: Any,
    facts: ModelFacts,
    cache: CacheAdmin | None,
    tenant: str,
    prompt_ids: Sequence[int],
    done: PrefillDone,
    with_text: bool = True,
    tools: tuple[int, int] | None = None,
) -> Explanation:
    """The explanation of one request's cache outcome (see the module docstring); ``with_text``
    False leaves the cached side's text out of a divergence (its position stays). ``tools`` is
    where the tool definitions are in the prompt (``proxy.tools.prompt.tools_span``): a
    divergence inside them is reported as ``"reason": "tools changed"``, in the first block too
    (then without the cached side's text: it may be another conversation's)."""
    block, reason = done.first_miss
    out = Explanation(
        cache=done.kind,
        prompt_tokens=done.prompt_tokens,
        cached_tokens=done.cached_tokens,
        prompt_blocks=num_full_blocks(done.prompt_tokens),
        blocks_matched=done.cached_blocks,
        block_tokens=done.cached_tokens - done.tail_tokens,
        tail_tokens=done.tail_tokens,
        first_unmatched_block=block,
        reason=reason,
        divergence=None,
        load_seconds=round(done.load_s, 6),
        prefill_seconds=round(done.prefill_s, 6),
    )
    # NOTE: no divergence for block 0 (unless the tools are in it): comparing with an unrelated
    # first block says nothing, and would show text of other requests to a client that knows none
    # of the prompt.
    # NOTE: nor for the partial block after the last full one (its tail failed: no sibling to compare)
    if cache is None or block is None or reason in _NOTHING_TO_COMPARE or block >= out.prompt_blocks:
        return out
    if not block and (tools is None or not tools[0] < min(tools[1], BLOCK_SIZE)):
        return out
    found = await run_in_threadpool(cache.divergence, facts.namespace(tenant), prompt_ids, block)
    if found is None:
        return out
    position, sibling = found
    said: MissReason | str | None = reason
    if tools is not None and tools[0] <= position < tools[1]:
        said = TOOLS_CHANGED
    with_text = with_text and block > 0
    cached_seq = list(prompt_ids[: block * BLOCK_SIZE]) + sibling
    span = slice(max(0, position - EXCERPT_TOKENS), position + EXCERPT_TOKENS)
    decode = tokenizer.decode
    cached = decode(cached_seq[span]) if with_text else None
    shown = Divergence(position, cached, decode(list(prompt_ids)[span]))
    return dataclasses.replace(out, reason=said, divergence=shown)


def explanation_header(explanation: Explanation) -> str:
    """The explanation as one header value (compact, ASCII-only JSON)."""
    return json.dumps(explanation.as_json(), separators=(",", ":"), ensure_ascii=True)
