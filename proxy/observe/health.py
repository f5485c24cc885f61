"""``GET /health``: liveness plus the state of the cache (ok, degraded or disabled)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from proxy.state import CacheDep, EngineDep, SettingsDep, StartedDep
from store.index.memory.index import MEMORY_URL

router = APIRouter()


@router.get("/health")
async def health(
    engine: EngineDep, cache: CacheDep, settings: SettingsDep, started: StartedDep
) -> dict[str, Any]:
    """Liveness; ``started`` (Unix seconds) changes when the server restarts, and
    ``cache_persistent`` tells a router whether the prefixes it remembered there survive that (a
    Redis index: yes; ``memory://`` or no cache: no)."""
    state = "disabled" if cache is None else await run_in_threadpool(cache.health)
    return {
        "status": "ok",
        "cache": state,
        "model": engine.loaded.name,
        "format": f"{engine.loaded.format}, {engine.decoder.name} decode step",
        "attention": engine.loaded.attention,
        "busy": not engine.idle,
        "queue_depth": engine.queue_depth,
        "started": started,
        "cache_persistent": cache is not None and not settings.redis_url.startswith(MEMORY_URL),
    }
