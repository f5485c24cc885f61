"""Named caches made, changed and let go: made from chat messages (their bytes reserved within
``--max-pinned-bytes`` first, then computed, stored and pinned), given a new expiry, deleted,
forgotten with the blocks ``kvproxy cache clear`` removes, and released when they expire
(``sweep_forever``). Only the caller that removes a record releases its pins
(``proxy.named.registry``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from hashing import BLOCK_SIZE
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.named.ledger import Limits, Refusal
from proxy.named.registry import NamedCache, NamedCaches
from proxy.named.service import chain, on_state, rendered
from proxy.serving.facts import served_model
from proxy.serving.running import store_prompt
from proxy.serving.validation import check_prompt_length
from proxy.tools.rendering import TemplateMessage
from store.admin_interface import CacheAdmin
from store.errors import StoreUnavailable
from store.index.redis.connect import REDIS_ERRORS

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
"""Seconds between looks for expired named caches (their pins are released then)."""


async def create(
    engine: Engine,
    cache: CacheAdmin,
    named: NamedCaches,
    settings: Settings,
    tenant: str,
    messages: list[TemplateMessage],
    expiry: Callable[[float], float],
    display_name: str,
) -> NamedCache:
    """Compute and store ``messages`` as a prompt's start, pin its full blocks until their
    expiry (``expiry(now)``, Unix seconds, asked once the content is stored: a TTL counts from
    when the cache exists) and keep the record.

    Raises:
        OpenAIError: 400 for content shorter than a block, longer than the context (a
            ``ContextExceeded``, for the dialect to word), or an expiry passed by then; 429 when
            the pinned bytes would pass the tenant's share of ``--max-pinned-bytes`` or the
            budget itself, counting the creates under way (``_refuse``, ``proxy.named.ledger``);
            503 when Redis is unreachable.
    """
    ids = await run_in_threadpool(rendered, engine.loaded.tokenizer, messages, False)
    if len(ids) < BLOCK_SIZE:
        raise OpenAIError(
            400,
            f"Cached content is too small: {len(ids)} tokens; a named cache holds at least one "
            f"{BLOCK_SIZE}-token block",
            param="contents",
        )
    check_prompt_length(served_model(engine).facts, len(ids), "contents")
    # NOTE: reserved before any work, so creates under way count against the share and the budget
    need = len(ids) // BLOCK_SIZE * engine.loaded.kv_spec.block_bytes
    limits, ticket = _limits(settings), uuid.uuid4().hex
    _refuse(await on_state(named.reserve, tenant, ticket, need, limits), limits, need)
    record = None
    try:
        record = await _made(engine, cache, tenant, ids, messages, expiry, display_name)
        _refuse(await on_state(named.commit, tenant, ticket, record, limits), limits, record.block_bytes)
    except BaseException:
        if record is not None:  # NOTE: made but not kept: its pins go
            await run_in_threadpool(cache.unpin, *chain(record))
        raise
    finally:
        try:
            await on_state(named.release, tenant, ticket)  # NOTE: none once committed
        except OpenAIError:  # NOTE: Redis failed: the reservation expires (RESERVATION_TTL_S)
            log.warning("named cache: a reservation could not be released (Redis)")
    return record


async def _made(
    engine: Engine,
    cache: CacheAdmin,
    tenant: str,
    ids: list[int],
    messages: list[TemplateMessage],
    expiry: Callable[[float], float],
    display_name: str,
) -> NamedCache:
    """``ids`` computed, stored and pinned until ``expiry(now)``; the record to keep (its pins are
    the caller's to release if it is not kept)."""
    namespace = engine.loaded.namespace(tenant)
    # NOTE: pinned before they are stored, so the byte budget cannot evict them meanwhile
    reserved = await run_in_threadpool(cache.pin, namespace, ids, _ttl(expiry(time.time())))
    if reserved is None:
        raise OpenAIError.cache_unavailable(": the named cache was not made")
    pinned = None
    try:
        await store_prompt(engine, ids, tenant, _ttl(expiry(time.time())))
        expires = expiry(time.time())
        if expires <= time.time():
            raise OpenAIError(400, "the expiry passed while the content was computed", param="expireTime")
        pinned = await run_in_threadpool(cache.pin, namespace, ids, _ttl(expires))  # NOTE: now stored
        if pinned is None or pinned.missing:
            raise OpenAIError(503, "the content's blocks could not be stored; try again", type="server_error")
        now = time.time()
        return NamedCache(
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
    except BaseException:
        if pinned is not None:
            await run_in_threadpool(cache.unpin, namespace, pinned.block_hashes)
        raise
    finally:
        await run_in_threadpool(cache.unpin, namespace, reserved.block_hashes)


def _ttl(expires: float) -> int:
    """Seconds a pinned block's entry is kept to outlive ``expires`` (then the sweep unpins it)."""
    return math.ceil(expires - time.time()) + 1


def _limits(settings: Settings) -> Limits:
    """A tenant's share of ``--max-pinned-bytes`` (``Settings.tenant_budget``) and the budget."""
    return Limits(settings.tenant_budget(settings.max_pinned_bytes), settings.max_pinned_bytes)


def _refuse(refusal: Refusal | None, limits: Limits, need: int) -> None:
    """Nothing when ``need`` bytes were charged (``refusal`` None); else the 429.

    Raises:
        OpenAIError: 429 past the tenant's share, with its own figures only (what its caches
            and creates under way hold, and ``need``); past the whole budget, with no figure,
            which would tell one tenant what the others pin.
    """
    if refusal is None:
        return
    if refusal.limit == "share":
        whose = "this tenant's share of " if limits.share < limits.budget else ""
        raise OpenAIError(
            429,
            f"the named caches' pinned blocks would pass {whose}--max-pinned-bytes ({limits.share} "
            f"bytes; your named caches pin {refusal.own}, this one needs {need}): delete one, or "
            "wait for one to expire",
            type="rate_limit_error",
            code="pinned_budget_exceeded",
        )
    raise OpenAIError(
        429,
        "the server's budget of pinned blocks (--max-pinned-bytes) is full: try again once "
        "other named caches expire",
        type="rate_limit_error",
        code="pinned_budget_exceeded",
        headers={"Retry-After": "60"},
    )


async def set_expiry(
    engine: Engine, cache: CacheAdmin, named: NamedCaches, tenant: str, record: NamedCache, expires: float
) -> NamedCache:
    """``record`` with a new expiry; its blocks' TTLs follow (pinned once more, then released once:
    the pin count stays).

    Raises:
        OpenAIError: 503 when Redis is unreachable.
    """
    namespace, hashes = chain(record)
    # NOTE: the ids it pinned
    ids = await run_in_threadpool(rendered, engine.loaded.tokenizer, record.messages, False)
    pinned = await run_in_threadpool(cache.pin, namespace, ids, _ttl(expires))
    if pinned is None:
        raise OpenAIError.cache_unavailable(": the expiry was not changed")
    await run_in_threadpool(cache.unpin, namespace, hashes)
    updated = dataclasses.replace(record, expires=expires, updated=time.time())
    # NOTE: a cache deleted meanwhile stays deleted: its pins were released by the delete
    if not await on_state(named.replace, tenant, updated):
        raise OpenAIError(404, f"CachedContent not found (or expired): {record.name}", param="name")
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
        StoreUnavailable: Redis failed.
    """
    try:
        gone = [c for c in named.every() if namespace_hex in (None, c.namespace)]
        return sum(named.delete(c.tenant_digest, c.id) is not None for c in gone)
    except REDIS_ERRORS as exc:
        raise StoreUnavailable(f"the named caches could not be cleared: {exc}") from exc


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
