"""Anthropic's prompt caching on kvproxy's blocks: the rules a body's ``cache_control`` marks must
keep (the core turns them into a TTL plan: ``proxy.serving.prompts.layout``), and
``usage.cache_creation``.

Source: Anthropic's API reference, Prompt caching (at most 4 breakpoints; TTLs ``5m`` and ``1h``,
a longer one never after a shorter one in the order tools, system, messages; top-level automatic
caching marks the last block) and Messages (text blocks are non-empty).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from hashing import BLOCK_SIZE
from proxy.anthropic.protocol import MAX_BREAKPOINTS, TTL_S, CacheCreation, MessagesRequest

if TYPE_CHECKING:
    from store.interface import TtlPlan


def breakpoint_error(body: MessagesRequest) -> tuple[str, str] | None:
    """``(param, message)`` for the first of Anthropic's prompt-caching rules the body breaks:
    an empty text block; more than ``MAX_BREAKPOINTS`` ``cache_control`` marks (the top-level
    one included); a ``1h`` mark after a ``5m`` one, in Anthropic's order (tools, system,
    messages); a top-level mark whose TTL differs from one already on the last block."""
    marks: list[tuple[str, str]] = []  # (param, ttl), in the cache order
    for i, tool in enumerate((body.model_extra or {}).get("tools") or []):
        mark = tool.get("cache_control") if isinstance(tool, dict) else None
        if isinstance(mark, dict):
            marks.append((f"tools[{i}].cache_control", str(mark.get("ttl", "5m"))))
    placed = [("system", b) for b in body.system] if isinstance(body.system, list) else []
    for i, message in enumerate(body.messages):
        if isinstance(message.content, list):
            placed += [(f"messages[{i}].content", b) for b in message.content]
    counts: dict[str, int] = {}
    for where, block in placed:
        j = counts[where] = counts.get(where, -1) + 1
        if block.type == "text" and not block.text:
            return f"{where}[{j}].text", "text content blocks must be non-empty"
        if block.cache_control is not None:
            marks.append((f"{where}[{j}].cache_control", block.cache_control.ttl))
    if body.cache_control is not None:  # NOTE: it marks the last message's last block
        content = body.messages[-1].content
        target = content[-1].cache_control if isinstance(content, list) and content else None
        if target is None:
            marks.append(("cache_control", body.cache_control.ttl))
        elif target.ttl != body.cache_control.ttl:
            return "cache_control.ttl", (
                f"Top-level cache_control has ttl='{body.cache_control.ttl}' but the target block "
                f"already has cache_control with ttl='{target.ttl}'"
            )
    if len(marks) > MAX_BREAKPOINTS:
        return "cache_control", (
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marks)}."
        )
    for (_, before), (param, ttl) in itertools.pairwise(marks):
        if TTL_S.get(ttl, 0) > TTL_S.get(before, 0):
            return param, (
                f"a ttl='{ttl}' cache_control block must not come after a ttl='{before}' cache_control "
                "block. Note that blocks are processed in the following order: `tools`, `system`, "
                "`messages`."
            )
    return None


def creation(plan: TtlPlan, server_ttl: int, start: int, created: int) -> CacheCreation:
    """``usage.cache_creation``: the ``created`` tokens stored from position ``start`` on, by the
    TTL their block was stored with (``plan``, the prompt's TTL plan; None and blocks past it: the
    server's ``--ttl``): ``ephemeral_1h_input_tokens`` those kept an hour or longer, the rest
    ``ephemeral_5m_input_tokens``."""
    long, end = 0, start + created
    for block in range(start // BLOCK_SIZE, -(-end // BLOCK_SIZE)):
        ttl = _block_ttl(plan, block)
        if (server_ttl if ttl is None else ttl) >= TTL_S["1h"]:
            long += min((block + 1) * BLOCK_SIZE, end) - max(block * BLOCK_SIZE, start)
    return CacheCreation(ephemeral_5m_input_tokens=created - long, ephemeral_1h_input_tokens=long)


def _block_ttl(plan: TtlPlan, block: int) -> int | None:
    """Block ``block``'s TTL under ``plan`` (None: the server's)."""
    if plan is None or isinstance(plan, int):
        return plan
    return plan[block] if block < len(plan) else None
