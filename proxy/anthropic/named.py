"""A Messages body that names a named cache (``cached_content``, ``proxy.named.field``): the
cache's system prompt and messages go before the body's, so the request reads the cache's pinned
blocks as hits (``proxy.named.service.with_cache`` says which bodies are refused)."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request

from engine.worker import Engine
from proxy.anthropic.protocol import Message, MessagesRequest
from proxy.named import service
from proxy.named.field import FIELD, cache_name, recorded_model

M = TypeVar("M", bound=MessagesRequest)


async def messages_body(request: Request, engine: Engine, body: M, tenant: str) -> M:
    """A Messages ``body`` with its named cache's system prompt and messages first (``body``
    itself when it names none).

    Raises:
        OpenAIError: as ``proxy.named.service.with_cache`` (a ``system`` of the body's own is a
            system instruction beside the cache's).
    """
    if (name := cache_name(body.model_extra)) is None:
        return body
    given = [{"role": "system"}] if body.system else []
    named = service.get_named(request)
    model = recorded_model(body.model, engine.loaded.name, engine.loaded.served_names)
    tools = (body.model_extra or {}).get("tools")
    cached = await service.with_cache(named, tenant, name, model, given, FIELD, tools)
    system = "\n\n".join(m["content"] for m in cached if m["role"] == "system") or None
    turns = [Message.model_validate(m) for m in cached if m["role"] != "system"]
    return body.model_copy(update={"system": system, "messages": turns + body.messages})
