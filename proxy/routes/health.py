"""``GET /health``: liveness plus the state of the cache (ok, degraded or disabled)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from proxy.state import get_cache, get_engine
from store.cache import BlockCache

router = APIRouter()


@router.get("/health")
async def health(
    engine: Annotated[Engine, Depends(get_engine)],
    cache: Annotated[BlockCache | None, Depends(get_cache)],
) -> dict[str, Any]:
    state = "disabled" if cache is None else await run_in_threadpool(cache.health)
    return {
        "status": "ok",
        "cache": state,
        "model": engine.loaded.name,
        "busy": not engine.idle,
        "queue_depth": engine.queue_depth,
    }
