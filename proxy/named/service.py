"""Named caches as a service: where they are kept, and how a request of any dialect finds one by
name (``cached_content``) and starts from it (``proxy.named.lifecycle`` makes, changes and
releases them).

A request that names a cache starts with the cache's messages; the rest of its prompt follows.
Chat templates render turn after turn, so its prompt starts with the cache's tokens and reads its
pinned blocks as hits; the tokens after the cache's last full block are computed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

from hashing import BlockHash, Namespace
from proxy.http.errors import OpenAIError, on_redis
from proxy.named.registry import NamedCache, NamedCaches
from proxy.tools.rendering import RenderError, TemplateMessage, render_chat

T = TypeVar("T")

log = logging.getLogger(__name__)

PREFIX = "cachedContents/"


def get_named(request: Request) -> NamedCaches:
    """The app's named caches (``proxy.stores.open_named``)."""
    named: NamedCaches = request.app.state.named
    return named


NamedDep = Annotated[NamedCaches, Depends(get_named)]


async def on_state(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the named caches' store, in a thread.

    Raises:
        OpenAIError: 503 when Redis fails (``proxy.http.errors.on_redis``).
    """
    return await on_redis(fn, *args, detail=lambda _: ": named caches are unavailable")


def chain(record: NamedCache) -> tuple[Namespace, list[BlockHash]]:
    """The namespace and block hashes ``record`` pins."""
    return Namespace(bytes.fromhex(record.namespace)), [
        BlockHash(bytes.fromhex(h)) for h in record.block_hashes
    ]


def rendered(tokenizer: Any, messages: list[TemplateMessage], generation_prompt: bool = True) -> list[int]:
    """``messages`` rendered by ``tokenizer``'s chat template as a prompt, or
    (``generation_prompt`` False) as a cache's content.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    try:
        return render_chat(tokenizer, messages, add_generation_prompt=generation_prompt)
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc


async def find(named: NamedCaches, tenant: str, name: str) -> NamedCache:
    """``tenant``'s live cache ``name`` (``cachedContents/{id}``, or the id).

    Raises:
        OpenAIError: 404 when ``tenant`` has no such cache (another tenant's is not found
            either), or it expired; 503 when Redis is unreachable.
    """
    record = await on_state(named.get, tenant, name.removeprefix(PREFIX))
    if record is None or record.expires <= time.time():
        raise OpenAIError(404, f"CachedContent not found (or expired): {name}", param="cached_content")
    return record


async def with_cache(
    named: NamedCaches,
    tenant: str,
    name: str,
    model: str,
    messages: list[TemplateMessage],
    param: str,
    tools: object = None,
) -> list[TemplateMessage]:
    """The cache ``name``'s messages, then ``messages`` (a request's, naming it in ``param``).

    Raises:
        OpenAIError: 404 when ``tenant`` has no live cache ``name``; 400 when it was made for
            another model, or the request brings a system message or ``tools`` of its own (as
            Gemini refuses a system instruction or tools beside a cached content: a chat
            template renders both before the cache's content, which would then never be read).
    """
    if tools:
        raise OpenAIError(400, "a request naming a cached content cannot bring tools", param=param)
    record = await find(named, tenant, name)
    if record.model != model:
        raise OpenAIError(
            400,
            f"the request's model ({model}) and the cached content's ({record.model}) must be the same",
            param=param,
        )
    if any(m.get("role") in ("system", "developer") for m in messages):
        raise OpenAIError(
            400, "a request naming a cached content cannot set a system instruction", param=param
        )
    return record.messages + messages
