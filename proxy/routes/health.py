"""``GET /health``: liveness plus the state of the cache (ok, degraded or disabled)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from proxy.state import CacheDep, EngineDep

router = APIRouter()


@router.get("/health")
async def health(request: Request, engine: EngineDep, cache: CacheDep) -> dict[str, Any]:
    """Liveness; ``started`` (Unix seconds) changes when the server restarts, which tells a router
    that the prefixes it remembered there are gone."""
    state = "disabled" if cache is None else await run_in_threadpool(cache.health)
    return {
        "status": "ok",
        "cache": state,
        "model": engine.loaded.name,
        "format": f"{engine.loaded.format}, {engine.decoder.name} decode step",
        "busy": not engine.idle,
        "queue_depth": engine.queue_depth,
        "started": request.app.state.started,
    }
