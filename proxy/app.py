"""The app factory: ``create_app(settings)``; the lifespan builds the engine and the cache."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.concurrency import run_in_threadpool

from engine.loading import LoadedModel, load_model
from engine.worker import Engine
from proxy.auth import parse_api_keys
from proxy.config import Settings
from proxy.errors import install_error_handlers
from proxy.limits import BodySizeLimit
from proxy.metrics import Metrics, RequestMetrics
from proxy.routes import cache, chat, completions, health, models, observe
from store.blobs import BlobStore
from store.cache import BlockCache
from store.index import RedisIndex
from store.interface import KVSpec

log = logging.getLogger(__name__)


def redis_client(settings: Settings) -> redis.Redis:
    """A client whose every operation fails within ``settings.redis_timeout`` seconds.

    NOTE: redis-py retries failed commands by default (with backoff); a cache must not: a slow
    Redis becomes a miss at once and the circuit breaker takes it from there.
    """
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.redis_timeout,
        socket_connect_timeout=settings.redis_timeout,
        retry=Retry(NoBackoff(), 0),
    )


def blob_budget(settings: Settings) -> int:
    """``--max-cache-bytes``, or half of the free disk under the blob directory now."""
    if settings.max_cache_bytes is not None:
        return settings.max_cache_bytes
    settings.blob_root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(settings.blob_root).free // 2


RAM_BLOCKS_WARNING = 16
"""A RAM tier holding fewer blocks than this (2,048 tokens) is worth a warning at start."""


def build_cache(settings: Settings, spec: KVSpec) -> BlockCache:
    """The prefix cache described by ``settings``. Never fails on an unreachable Redis: the
    cache starts degraded (serving misses) and resumes on its own when Redis answers."""
    budget = blob_budget(settings)
    cache = BlockCache(
        RedisIndex(redis_client(settings), settings.key_prefix),
        BlobStore(settings.blob_root),
        spec,
        ttl_s=settings.ttl,
        max_bytes=budget,
        breaker_cooldown_s=settings.redis_retry,
        ram_bytes=settings.ram_cache_bytes,
    )
    ram_blocks = settings.ram_cache_bytes // spec.block_bytes
    log.info(
        "blob store %s: budget %.1f MB (--max-cache-bytes); RAM tier %.1f MB, %d blocks (--ram-cache-bytes)",
        settings.blob_root,
        budget / 1e6,
        settings.ram_cache_bytes / 1e6,
        ram_blocks,
    )
    if 0 < settings.ram_cache_bytes and ram_blocks < RAM_BLOCKS_WARNING:
        log.warning(
            "--ram-cache-bytes %d holds only %d blocks of %d bytes: a prefix longer than that is "
            "read from disk on every hit (0 turns the RAM tier off)",
            settings.ram_cache_bytes,
            ram_blocks,
            spec.block_bytes,
        )
    if cache.health() != "ok":
        log.warning(
            "Redis at %s is unreachable: serving uncached for now. Start it (redis-server) or set "
            "KVPROXY_REDIS_URL / --redis-url; caching starts on its own once it answers.",
            settings.redis_url,
        )
    return cache


class GarbageCollector:
    """Runs ``cache.gc`` every ``interval_s`` seconds on a daemon thread until stopped."""

    def __init__(self, cache: BlockCache, interval_s: float, grace_s: float) -> None:
        self.cache, self.interval_s, self.grace_s = cache, interval_s, grace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvproxy-gc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.cache.gc(self.grace_s)
            except OSError as exc:
                log.warning("garbage collection failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def create_app(settings: Settings | None = None, loaded: LoadedModel | None = None) -> FastAPI:
    """The kvproxy ASGI app.

    Args:
        settings: configuration (default: from the environment).
        loaded: an already loaded model to serve (tests share one); loaded from
            ``settings.model`` at start-up when None.
    """
    settings = settings or Settings()
    api_keys = parse_api_keys(settings.api_keys)

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
        block_cache = None if settings.no_cache else build_cache(settings, model.kv_spec)
        collector = None
        if block_cache is not None:
            collector = GarbageCollector(block_cache, settings.gc_interval, settings.gc_grace)
        engine = Engine(model, block_cache, settings.max_queue, settings.max_batch)
        app.state.settings, app.state.cache, app.state.engine = settings, block_cache, engine
        app.state.metrics = Metrics(engine, block_cache)
        log.info("serving %s (cache %s)", model.name, "off" if block_cache is None else settings.blob_root)
        yield
        if collector is not None:
            collector.stop()
        await run_in_threadpool(engine.close)

    app = FastAPI(title="kvproxy", lifespan=lifespan)
    app.state.api_keys = api_keys
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics)
    install_error_handlers(app)
    for module in (chat, completions, models, health, cache, observe):
        app.include_router(module.router)
    return app
