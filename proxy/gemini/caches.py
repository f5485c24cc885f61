"""``/v1beta/cachedContents``: Gemini's named caches (create, list, get, patch the expiry,
delete) on kvproxy's blocks, each one its tenant's alone (``proxy.named``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from engine.worker import Engine
from hashing import BLOCK_SIZE
from proxy.config import Settings
from proxy.gemini.answers import CachedContent, CachedContentList
from proxy.gemini.limits import context_error
from proxy.gemini.protocol import (
    CachedContentRequest,
    chat_messages,
    model_name,
    refuse_unsupported,
    timestamp,
)
from proxy.http.auth import Tenant
from proxy.http.errors import OpenAIError
from proxy.http.numbers import page_bounds
from proxy.named import lifecycle, service
from proxy.named.registry import NamedCache, NamedCaches, tenant_digest
from proxy.named.service import NamedDep
from proxy.serving.facts import served_model
from proxy.serving.validation import ContextExceeded, check_model
from proxy.state import CacheOnDep, EngineDep, SettingsDep
from store.admin_interface import CacheAdmin

router = APIRouter()
DEFAULT_TTL_S = 3600
"""A named cache's lifetime when neither ``ttl`` nor ``expireTime`` is given (Gemini's hour)."""
PAGE_MOST = 1000
"""The largest ``pageSize`` of a listing (Gemini's)."""


def described(record: NamedCache) -> CachedContent:
    """A cache as Gemini's ``CachedContent`` (contents left out, as Gemini leaves them), with
    kvproxy's ``usageMetadata.cachedBlockBytes`` and ``cachedBlockTokens`` beside the count."""
    return {
        "name": record.name,
        "model": f"models/{record.model}",
        "displayName": record.display_name,
        "createTime": timestamp(record.created),
        "updateTime": timestamp(record.updated),
        "expireTime": timestamp(record.expires),
        "usageMetadata": {
            "totalTokenCount": record.tokens,
            "cachedBlockTokens": len(record.block_hashes) * BLOCK_SIZE,
            "cachedBlockBytes": record.block_bytes,
        },
    }


@dataclass(frozen=True)
class Caching:
    """What making and changing a named cache needs."""

    engine: Engine
    cache: CacheAdmin
    settings: Settings
    named: NamedCaches
    tenant: str


def caching(
    engine: EngineDep, cache: CacheOnDep, settings: SettingsDep, named: NamedDep, tenant: Tenant
) -> Caching:
    return Caching(engine, cache, settings, named, tenant)


CachingDep = Annotated[Caching, Depends(caching)]


@router.post("/v1beta/cachedContents")
async def create(body: CachedContentRequest, c: CachingDep) -> dict[str, Any]:
    """Compute the content, pin its blocks until its expiry and answer the ``CachedContent``."""
    engine, settings = c.engine, c.settings
    if body.model is None:
        raise OpenAIError(400, "model: a cached content names its model", param="model")
    check_model(served_model(engine).facts, model_name(body.model))
    refuse_unsupported(body)
    if not body.contents:
        raise OpenAIError(400, "contents: a cached content needs at least one content", param="contents")
    if settings.max_pinned_bytes == 0:
        raise OpenAIError(400, "named caches are off on this server (--max-pinned-bytes 0)", param="model")
    messages = chat_messages(body.system_instruction, body.contents)
    longest = settings.max_ttl
    body.expiry(time.time(), min(DEFAULT_TTL_S, longest), longest)  # NOTE: a bad one fails before any work

    def expiry(now: float) -> float:
        return body.expiry(now, min(DEFAULT_TTL_S, longest), longest)

    try:
        made = await lifecycle.create(
            engine, c.cache, c.named, settings, c.tenant, messages, expiry, body.display_name
        )
    except ContextExceeded as exc:
        raise context_error(exc) from None
    return dict(described(made))


@router.get("/v1beta/cachedContents")
async def listing(
    named: NamedDep,
    tenant: Tenant,
    page_size: Annotated[str, Query(alias="pageSize")] = "100",
    page_token: Annotated[str, Query(alias="pageToken")] = "",
) -> dict[str, Any]:
    """The tenant's live caches, oldest first, ``pageSize`` a page (``nextPageToken`` the next).

    Raises:
        OpenAIError: 400 for a ``pageSize`` or ``pageToken`` this server did not give.
    """
    start, size = page_bounds(page_token, page_size, PAGE_MOST)
    now = time.time()
    live = [c for c in await service.on_state(named.of_tenant, tenant) if c.expires > now]
    out: CachedContentList = {"cachedContents": [described(c) for c in live[start : start + size]]}
    if start + size < len(live):
        out["nextPageToken"] = str(start + size)
    return dict(out)


@router.get("/v1beta/cachedContents/{cache_id}")
async def get(cache_id: str, named: NamedDep, tenant: Tenant) -> dict[str, Any]:
    return dict(described(await service.find(named, tenant, cache_id)))


@router.patch("/v1beta/cachedContents/{cache_id}")
async def update(cache_id: str, body: CachedContentRequest, c: CachingDep) -> dict[str, Any]:
    """A new expiry (``ttl`` or ``expireTime``; nothing else of a cache changes)."""
    if body.ttl is None and body.expire_time is None:
        raise OpenAIError(400, "only ttl or expireTime can be updated", param="ttl")
    record = await service.find(c.named, c.tenant, cache_id)
    expires = body.expiry(time.time(), DEFAULT_TTL_S, c.settings.max_ttl)
    return dict(described(await lifecycle.set_expiry(c.engine, c.cache, c.named, c.tenant, record, expires)))


@router.delete("/v1beta/cachedContents/{cache_id}")
async def delete(cache_id: str, cache: CacheOnDep, named: NamedDep, tenant: Tenant) -> dict[str, Any]:
    """Delete the cache and release its blocks to the byte budget."""
    if not await lifecycle.delete(cache, named, tenant_digest(tenant), cache_id.removeprefix(service.PREFIX)):
        raise OpenAIError(404, f"CachedContent not found: cachedContents/{cache_id}", param="name")
    return {}
