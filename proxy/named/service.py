"""Named caches as a service: made from chat messages (computed, stored, then pinned within
``--max-pinned-bytes``), found by name for a request of any dialect (``cached_content``), given a
new expiry, deleted, and released when they expire (``sweep_forever``).

A request that names a cache starts with the cache's messages; the rest of its prompt follows.
Chat templates render turn after turn, so its prompt starts with the cache's tokens and reads its
pinned blocks as hits; the tokens after the cache's last full block are computed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from hashing import BLOCK_SIZE, BlockHash, Namespace
from proxy.cache_api.prewarm import store_prompt
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.named.registry import MemoryNamedCaches, NamedCache, NamedCaches, RedisNamedCaches
from proxy.responses.state import STATE_TIMEOUT_S
from proxy.serving.rendering import RenderError, render_chat
from proxy.serving.validation import check_prompt_length
from store.admin_interface import CacheAdmin
from store.index.memory.index import MEMORY_URL
from store.index.redis.connect import REDIS_ERRORS, redis_client

T = TypeVar("T")

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
"""Seconds between looks for expired named caches (their pins are released then)."""
PREFIX = "cachedContents/"


def open_named(settings: Settings) -> NamedCaches:
    """The named caches ``--redis-url`` names (in this process for ``memory://``)."""
    if settings.redis_url.startswith(MEMORY_URL):
        return MemoryNamedCaches()
    client = redis_client(settings.redis_url, max(settings.redis_timeout, STATE_TIMEOUT_S))
    return RedisNamedCaches(client, settings.key_prefix)


def get_named(request: Request) -> NamedCaches:
    return request.app.state.named


async def on_state(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the named caches' store, in a thread; a Redis fault is a 503."""
    try:
        return await run_in_threadpool(fn, *args)
    except REDIS_ERRORS as exc:
        raise OpenAIError.cache_unavailable(": named caches are unavailable") from exc


def chain(record: NamedCache) -> tuple[Namespace, list[BlockHash]]:
    """The namespace and block hashes ``record`` pins."""
    return Namespace(bytes.fromhex(record.namespace)), [
        BlockHash(bytes.fromhex(h)) for h in record.block_hashes
    ]


def rendered(engine: Engine, messages: list[dict[str, Any]], generation_prompt: bool = True) -> list[int]:
    """``messages`` rendered as a prompt, or (``generation_prompt`` False) as a cache's content.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    try:
        return render_chat(engine.loaded.tokenizer, messages, add_generation_prompt=generation_prompt)
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc


async def create(
    engine: Engine,
    cache: CacheAdmin,
    named: NamedCaches,
    settings: Settings,
    tenant: str,
    messages: list[dict[str, Any]],
    expiry: Callable[[float], float],
    display_name: str,
) -> NamedCache:
    """Compute and store ``messages`` as a prompt's start, pin its full blocks until their
    expiry (``expiry(now)``, Unix seconds, asked once the content is stored: a TTL counts from
    when the cache exists) and keep the record.

    Raises:
        OpenAIError: 400 for content shorter than a block or longer than the context, or an
            expiry passed by then; 429 when the pinned bytes would pass ``--max-pinned-bytes``;
            503 when Redis is unreachable.
    """
    ids = await run_in_threadpool(rendered, engine, messages, False)
    if len(ids) < BLOCK_SIZE:
        raise OpenAIError(
            400,
            f"Cached content is too small: {len(ids)} tokens; a named cache holds at least one "
            f"{BLOCK_SIZE}-token block",
            param="contents",
        )
    check_prompt_length(engine, len(ids), "contents")
    namespace = engine.loaded.namespace(tenant)
    # NOTE: pinned before they are stored, so the byte budget cannot evict them meanwhile
    reserved = await run_in_threadpool(cache.pin, namespace, ids, _ttl(expiry(time.time())))
    if reserved is None:
        raise OpenAIError.cache_unavailable(": the named cache was not made")
    pinned = None
    try:
        await _check_budget(cache, settings, reserved.missing * engine.loaded.kv_spec.block_bytes)
        await store_prompt(engine, ids, tenant, _ttl(expiry(time.time())))
        expires = expiry(time.time())
        if expires <= time.time():
            raise OpenAIError(400, "the expiry passed while the content was computed", param="expireTime")
        pinned = await run_in_threadpool(cache.pin, namespace, ids, _ttl(expires))  # NOTE: now stored
        if pinned is None or pinned.missing:
            raise OpenAIError(503, "the content's blocks could not be stored; try again", type="server_error")
        await _check_budget(cache, settings, 0)  # NOTE: of two made at once, both may not fit
        now = time.time()
        record = NamedCache(
            id=uuid.uuid4().hex[:16],
            model=engine.loaded.name,
            display_name=display_name,
            messages=messages,
            namespace=namespace.hex(),
            block_hashes=[h.hex() for h in pinned.block_hashes],
            tokens=len(ids),
            block_bytes=pinned.held,
            created=now,
            updated=now,
            expires=expires,
        )
        await on_state(named.put, tenant, record)
    except BaseException:
        if pinned is not None:
            await run_in_threadpool(cache.unpin, namespace, pinned.block_hashes)
        raise
    finally:
        await run_in_threadpool(cache.unpin, namespace, reserved.block_hashes)
    return record


def _ttl(expires: float) -> int:
    """Seconds a pinned block's entry is kept to outlive ``expires`` (then the sweep unpins it)."""
    return math.ceil(expires - time.time()) + 1


async def _check_budget(cache: CacheAdmin, settings: Settings, need: int) -> None:
    """Raises OpenAIError: 429 when ``need`` more pinned bytes would pass ``--max-pinned-bytes``
    (503 when Redis cannot say)."""
    held = await run_in_threadpool(cache.pinned_bytes)
    if held is None:
        raise OpenAIError.cache_unavailable(": the named cache was not made")
    if held + need > settings.max_pinned_bytes:
        raise OpenAIError(
            429,
            f"the named caches' pinned blocks would pass --max-pinned-bytes "
            f"({settings.max_pinned_bytes} bytes; {held} are pinned, this one needs {need})",
            type="rate_limit_error",
            code="pinned_budget_exceeded",
        )


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
    messages: list[dict[str, Any]],
    param: str,
    tools: object = None,
) -> list[dict[str, Any]]:
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


async def set_expiry(
    engine: Engine, cache: CacheAdmin, named: NamedCaches, tenant: str, record: NamedCache, expires: float
) -> NamedCache:
    """``record`` with a new expiry; its blocks' TTLs follow (pinned once more, then released once:
    the pin count stays).

    Raises:
        OpenAIError: 503 when Redis is unreachable.
    """
    namespace, hashes = chain(record)
    ids = await run_in_threadpool(rendered, engine, record.messages, False)  # NOTE: the ids it pinned
    pinned = await run_in_threadpool(cache.pin, namespace, ids, _ttl(expires))
    if pinned is None:
        raise OpenAIError.cache_unavailable(": the expiry was not changed")
    await run_in_threadpool(cache.unpin, namespace, hashes)
    updated = dataclasses.replace(record, expires=expires, updated=time.time())
    await on_state(named.put, tenant, updated)
    return updated


async def delete(cache: CacheAdmin, named: NamedCaches, tenant_hex: str, cache_id: str) -> bool:
    """Remove a cache and release its pins (only the call that removed it does); whether it was
    there."""
    record = await on_state(named.delete, tenant_hex, cache_id)
    if record is None:
        return False
    await release(cache, record)
    return True


async def release(cache: CacheAdmin, record: NamedCache) -> None:
    """Release ``record``'s pins (a warning when Redis fails: its blocks then stay pinned until
    their TTL, the cache's expiry, runs out and the collector reclaims them)."""
    if not await run_in_threadpool(cache.unpin, *chain(record)):
        log.warning("named cache %s: its pins could not be released (Redis)", record.id)


def forget_cleared(named: NamedCaches, namespace_hex: str | None) -> int:
    """After ``kvproxy cache clear`` (of every namespace, or of one): delete the named caches
    whose blocks it removed (their pins went with them); how many.

    Raises:
        redis.RedisError: Redis failed.
    """
    gone = [c for c in named.every() if namespace_hex in (None, c.namespace)]
    return sum(named.delete(c.tenant_digest, c.id) is not None for c in gone)


async def sweep_forever(cache: CacheAdmin, named: NamedCaches) -> None:
    """Every ``SWEEP_INTERVAL_S`` seconds, delete the named caches that expired and release their
    pins (their blocks then have a second of TTL left, and go)."""
    while True:
        try:
            for record in await on_state(named.expired, time.time()):
                await delete(cache, named, record.tenant_digest, record.id)
        except OpenAIError as exc:  # NOTE: Redis is down: the next sweep finds them still
            log.debug("named caches: sweep failed (%s)", exc.message)
        await asyncio.sleep(SWEEP_INTERVAL_S)
