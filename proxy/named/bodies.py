"""A named cache used from the OpenAI and Anthropic routes: the extension field ``cached_content``
(``cachedContents/{id}``, as Gemini's requests name one) puts the cache's messages before the
body's, so the request reads the cache's pinned blocks as hits.

The body then goes on as if the client had sent those messages itself: same rendering, same
answer (``proxy.named.service.with_cache`` says which bodies are refused).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from engine.worker import Engine
from proxy.anthropic.protocol import Message, MessagesRequest
from proxy.http.errors import OpenAIError
from proxy.named import service
from proxy.openai.protocol import ChatCompletionRequest, ChatMessage

FIELD = "cached_content"
M = TypeVar("M", bound=MessagesRequest)


def _name(extra: dict[str, Any] | None) -> str | None:
    """The body's ``cached_content``, if any.

    Raises:
        OpenAIError: 400 when it is not a string.
    """
    name = (extra or {}).get(FIELD)
    if name is not None and not isinstance(name, str):
        raise OpenAIError(400, "cached_content: must be a string such as 'cachedContents/…'", param=FIELD)
    return name


def refuse_cached_content(body: BaseModel) -> None:
    """Raises OpenAIError: 400 when a body of a route that cannot start from a named cache
    (completions, the Responses API, ``/tokenize``) names one, rather than ignore it."""
    if (body.model_extra or {}).get(FIELD) is not None:
        raise OpenAIError(
            400,
            "cached_content is taken by /v1/chat/completions, /v1/messages and Gemini's routes only",
            param=FIELD,
        )


def _model(engine: Engine, model: str) -> str:
    """A body's model as named caches record it (an alias as the served name)."""
    return engine.loaded.name if model in engine.loaded.served_names else model


async def chat_body(
    request: Request, engine: Engine, body: ChatCompletionRequest, tenant: str
) -> ChatCompletionRequest:
    """``body`` with its named cache's messages first (``body`` itself when it names none).

    Raises:
        OpenAIError: as ``proxy.named.service.with_cache``.
    """
    if (name := _name(body.model_extra)) is None:
        return body
    given = [m.model_dump(exclude_none=True) for m in body.messages]
    named = service.get_named(request)
    model = _model(engine, body.model)
    merged = await service.with_cache(named, tenant, name, model, given, FIELD, body.tools)
    cached = [ChatMessage.model_validate(m) for m in merged[: len(merged) - len(given)]]
    return body.model_copy(update={"messages": cached + body.messages})


async def messages_body(request: Request, engine: Engine, body: M, tenant: str) -> M:
    """A Messages ``body`` with its named cache's system prompt and messages first.

    Raises:
        OpenAIError: as ``proxy.named.service.with_cache`` (a ``system`` of the body's own is a
            system instruction beside the cache's).
    """
    if (name := _name(body.model_extra)) is None:
        return body
    given = [{"role": "system"}] if body.system else []
    named = service.get_named(request)
    model, tools = _model(engine, body.model), (body.model_extra or {}).get("tools")
    cached = await service.with_cache(named, tenant, name, model, given, FIELD, tools)
    system = "\n\n".join(m["content"] for m in cached if m["role"] == "system") or None
    turns = [Message.model_validate(m) for m in cached if m["role"] != "system"]
    return body.model_copy(update={"system": system, "messages": turns + body.messages})
