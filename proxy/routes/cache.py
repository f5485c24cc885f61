"""Cache administration: ``GET /v1/cache/stats``, ``POST /v1/cache/gc``, ``POST /v1/cache/clear``.

Protected by ``--admin-key`` (``Authorization: Bearer <key>``); see ``proxy.auth.require_admin``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from proxy.auth import require_admin
from proxy.errors import OpenAIError
from proxy.state import CacheDep, EngineDep
from store.admin_interface import CacheAdmin
from store.connect import REDIS_ERRORS

router = APIRouter(prefix="/v1/cache", dependencies=[Depends(require_admin)])


def _require_cache(cache: CacheAdmin | None) -> CacheAdmin:
    if cache is None:
        raise OpenAIError(400, "caching is off on this server (--no-cache)", code="cache_disabled")
    return cache


@router.get("/stats")
async def cache_stats(engine: EngineDep, cache: CacheDep) -> dict[str, Any]:
    """Deployment-wide counters (from Redis, summed over every process) and this process's own."""
    process: dict[str, Any] = {"engine": dataclasses.asdict(engine.stats())}
    deployment = None
    if cache is not None:
        process["cache"] = cache.stats().as_dict()
        deployment = await run_in_threadpool(cache.deployment_stats)
    return {"deployment": deployment, "process": process}


@router.post("/gc")
async def cache_gc(cache: CacheDep) -> dict[str, Any]:
    """Run one garbage collection now (grace period as configured)."""
    found = await run_in_threadpool(_require_cache(cache).gc)
    if found is None:
        raise OpenAIError(503, "Redis is unreachable", type="server_error", code="cache_unavailable")
    return dataclasses.asdict(found)


class ClearRequest(BaseModel):
    namespace: str | None = Field(None, pattern="^[0-9a-f]{32}$", description="Only this namespace (hex).")


@router.post("/clear")
async def cache_clear(cache: CacheDep, body: ClearRequest | None = None) -> dict[str, Any]:
    """Remove every cached block, or one namespace's."""
    admin = _require_cache(cache)
    try:
        removed = await run_in_threadpool(admin.clear, body.namespace if body else None)
    except REDIS_ERRORS as exc:
        raise OpenAIError(
            503, f"Redis is unreachable: {exc}", type="server_error", code="cache_unavailable"
        ) from exc
    return {"removed_blocks": removed}
