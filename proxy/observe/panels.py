"""The dashboard's tables in ``/stats``: hot prefixes, with their text for the viewer's own tenant
only, and hit rates per tenant. Each function reads Redis (through the cache's guard: None when
it is unreachable) and may decode tokens: call them off the event loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from engine.model.loading import LoadedModel
from hashing import Namespace
from proxy.http.auth import DEFAULT_TENANT
from proxy.tools.rendering import RenderError, render_chat
from store.admin_interface import CacheAdmin

TEXT_CHARS = 60
"""Characters of a hot prefix's text shown."""
HOT_PREFIXES = 10


def prefix_text(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """The first ``TEXT_CHARS`` characters of the text of ``token_ids`` (special tokens left out,
    each run of whitespace as one space), after the longest of the chat template's ``chat_leads``
    they start with, so that chats are told apart by their own first message, not by what the
    template writes before every chat (SmolLM2's default system prompt); the whole text when
    nothing follows the lead."""
    ids = list(token_ids)
    lead = next(
        (len(lead) for lead in chat_leads(tokenizer) if len(lead) < len(ids) and _starts(ids, lead)), 0
    )
    text = tokenizer.decode(ids[lead:], skip_special_tokens=True)
    return " ".join(text.split())[:TEXT_CHARS]


_PROBES = ("x", "7 \n")
"""Two first messages that share no first character."""


@lru_cache(maxsize=8)
def chat_leads(tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """The token ids the chat template writes before a chat's first message's text, longest
    first: before a user's first message (for SmolLM2: its default system prompt, then the user's
    header) and before a system message (its header). Found as the tokens two renderings with
    different first messages share; none for a model without a chat template."""
    leads: set[tuple[int, ...]] = set()
    for role in ("user", "system"):
        after = [] if role == "user" else [{"role": "user", "content": "hi"}]
        try:
            a, b = (
                render_chat(
                    tokenizer, [{"role": role, "content": probe}, *after], add_generation_prompt=False
                )
                for probe in _PROBES
            )
        except RenderError:
            continue
        shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        leads |= {tuple(a[:shared])} if shared else set()
    return tuple(sorted(leads, key=len, reverse=True))


def _starts(ids: list[int], lead: tuple[int, ...]) -> bool:
    return tuple(ids[: len(lead)]) == lead


def tenant_names(loaded: LoadedModel, api_keys: Mapping[str, str] | None) -> dict[str, str]:
    """Tenant name by namespace hex, for every tenant of the API keys table and ``default``."""
    names = {DEFAULT_TENANT, *(api_keys or {}).values()}
    return {loaded.namespace(name).hex(): name for name in sorted(names)}


def hot_prefixes(
    cache: CacheAdmin,
    loaded: LoadedModel,
    scope: Namespace | None,
    viewer: Namespace | None,
    api_keys: Mapping[str, str] | None,
) -> list[dict[str, Any]] | None:
    """The hot prefixes of ``scope`` (None: every namespace), each with its ``tenant`` (name, or
    the namespace hex for another model or format) and ``text``: the first characters of its
    prompt for the ``viewer``'s namespace, else None (another tenant's prompt is never shown)."""
    rows = cache.hot_prefixes(scope, viewer, HOT_PREFIXES)
    if rows is None:
        return None
    names = tenant_names(loaded, api_keys)
    for row in rows:
        ids = row.pop("token_ids")
        row["tenant"] = names.get(row["namespace"], row["namespace"])
        row["text"] = None if ids is None else prefix_text(loaded.tokenizer, ids)
    return rows


def tenant_rates(
    cache: CacheAdmin, loaded: LoadedModel, api_keys: Mapping[str, str] | None
) -> list[dict[str, Any]] | None:
    """Hit rates per namespace with traffic (``CacheAdmin.tenant_rates``), each with its
    ``tenant``: the name, or the namespace hex for another model or format."""
    names = tenant_names(loaded, api_keys)
    rows = cache.tenant_rates([Namespace(bytes.fromhex(ns)) for ns in names])
    for row in rows or ():
        row["tenant"] = names.get(row["namespace"], row["namespace"])
    return rows
