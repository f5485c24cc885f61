"""Cache administration: ``GET /v1/cache/stats``, ``POST /v1/cache/gc``, ``POST /v1/cache/clear``.

Protected by ``--admin-key`` (``Authorization: Bearer <key>``); see ``proxy.http.auth.require_admin``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from proxy.cache_api.protocol import ClearRequest, ProcessCounters
from proxy.http.auth import require_admin
from proxy.http.errors import OpenAIError
from proxy.named.lifecycle import forget_cleared
from proxy.named.service import NamedDep
from proxy.state import CacheDep, CacheOnDep, EngineDep
from store.errors import StoreUnavailable

router = APIRouter(prefix="/v1/cache", dependencies=[Depends(require_admin)])


@router.get("/stats")
async def cache_stats(engine: EngineDep, cache: CacheDep) -> dict[str, Any]:
    """Deployment-wide counters (from Redis, summed over every process) and this process's own."""
    process: ProcessCounters = {"engine": dataclasses.asdict(engine.stats())}
    deployment = None
    if cache is not None:
        process["cache"] = cache.stats().as_dict()
        found = await run_in_threadpool(cache.deployment_stats)
        deployment = found.as_dict() if found is not None else None
    return {"deployment": deployment, "process": process}


@router.post("/gc")
async def cache_gc(cache: CacheOnDep) -> dict[str, Any]:
    """Run one garbage collection now (grace period as configured)."""
    found = await run_in_threadpool(cache.gc)
    if found is None:
        raise OpenAIError.cache_unavailable()
    return dataclasses.asdict(found)


@router.post("/clear")
async def cache_clear(cache: CacheOnDep, named: NamedDep, body: ClearRequest | None = None) -> dict[str, Any]:
    """Remove every cached block, or one namespace's, and the named caches they held."""
    namespace = body.namespace if body else None
    try:
        removed = await run_in_threadpool(cache.clear, namespace)
        forgotten = await run_in_threadpool(forget_cleared, named, namespace)
    except StoreUnavailable as exc:
        raise OpenAIError.cache_unavailable(f": {exc}") from exc
    return {"removed_blocks": removed, "removed_named_caches": forgotten}
