"""A chat completion that names a named cache (``cached_content``, ``proxy.named.field``): the
cache's messages go before the body's, so the request reads the cache's pinned blocks as hits.

The body then goes on as if the client had sent those messages itself: same rendering, same
answer (``proxy.named.service.with_cache`` says which bodies are refused).
"""

from __future__ import annotations

from fastapi import Request

from engine.worker import Engine
from proxy.named import service
from proxy.named.field import FIELD, cache_name, recorded_model
from proxy.openai.protocol import ChatCompletionRequest, ChatMessage


async def chat_body(
    request: Request, engine: Engine, body: ChatCompletionRequest, tenant: str
) -> ChatCompletionRequest:
    """``body`` with its named cache's messages first (``body`` itself when it names none).

    Raises:
        OpenAIError: as ``proxy.named.service.with_cache``.
    """
    if (name := cache_name(body.model_extra)) is None:
        return body
    given = [m.model_dump(exclude_none=True) for m in body.messages]
    named = service.get_named(request)
    model = recorded_model(body.model, engine.loaded.name, engine.loaded.served_names)
    merged = await service.with_cache(named, tenant, name, model, given, FIELD, body.tools)
    cached = [ChatMessage.model_validate(m) for m in merged[: len(merged) - len(given)]]
    return body.model_copy(update={"messages": cached + body.messages})
