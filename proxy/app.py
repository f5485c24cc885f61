"""The app factory: ``create_app(settings)``; the lifespan builds the engine and the cache."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from engine.loading import LoadedModel, load_model
from engine.worker import Engine
from proxy.config import Settings
from proxy.errors import install_error_handlers
from proxy.routes import chat, completions, health, models
from store.blobs import BlobStore
from store.cache import BlockCache
from store.index import RedisIndex
from store.interface import KVSpec

log = logging.getLogger(__name__)


def build_cache(settings: Settings, spec: KVSpec) -> BlockCache:
    """The prefix cache described by ``settings``. Never fails on an unreachable Redis: the
    cache starts degraded (serving misses) and resumes on its own when Redis answers."""
    client = redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.redis_timeout,
        socket_connect_timeout=settings.redis_timeout,
    )
    cache = BlockCache(
        RedisIndex(client, settings.key_prefix),
        BlobStore(settings.blob_root),
        spec,
        ttl_s=settings.ttl,
        breaker_cooldown_s=settings.redis_retry,
    )
    if cache.health() != "ok":
        log.warning(
            "Redis at %s is unreachable: serving uncached for now. Start it (redis-server) or set "
            "KVPROXY_REDIS_URL / --redis-url; caching starts on its own once it answers.",
            settings.redis_url,
        )
    return cache


def create_app(settings: Settings | None = None, loaded: LoadedModel | None = None) -> FastAPI:
    """The kvproxy ASGI app.

    Args:
        settings: configuration (default: from the environment).
        loaded: an already loaded model to serve (tests share one); loaded from
            ``settings.model`` at start-up when None.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model = loaded
        if model is None:
            model = await run_in_threadpool(
                load_model,
                settings.model,
                cache_dir=settings.cache_dir,
                dtype=settings.dtype,
                device=settings.device,
            )
        cache = None if settings.no_cache else build_cache(settings, model.kv_spec)
        engine = Engine(model, cache, settings.max_queue)
        app.state.settings, app.state.cache, app.state.engine = settings, cache, engine
        log.info("serving %s (cache %s)", model.name, "off" if cache is None else settings.blob_root)
        yield
        await run_in_threadpool(engine.close)

    app = FastAPI(title="kvproxy", lifespan=lifespan)
    install_error_handlers(app)
    for module in (chat, completions, models, health):
        app.include_router(module.router)
    return app
