"""The one place the cache is opened from settings: the Redis client, the blob store, the budget.

``open_cache`` builds the serving cache (``kvproxy serve``); ``open_admin`` the administrative
view the ``kvproxy cache`` commands use (no model needed).
"""

from __future__ import annotations

import logging
import shutil

import redis
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from proxy.config import ServerSettings, Settings
from store.admin import StoreAdmin
from store.blobs import BlobStore
from store.cache import BlockCache
from store.index import RedisIndex
from store.interface import KVSpec
from store.memory import MemoryIndex
from store.parts import BlockIndex

log = logging.getLogger(__name__)

RAM_BLOCKS_WARNING = 16
"""A RAM tier holding fewer blocks than this (2,048 tokens) is worth a warning at start."""


def redis_client(settings: ServerSettings) -> redis.Redis:
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


MEMORY_URL = "memory://"
"""``--redis-url memory://``: the index in this process (``store.memory``), for one process alone."""


def open_index(settings: Settings) -> BlockIndex:
    """The block index ``--redis-url`` names: Redis, or this process's memory (Redis is not
    contacted yet)."""
    if settings.redis_url.startswith(MEMORY_URL):
        return MemoryIndex()
    return RedisIndex(redis_client(settings), settings.key_prefix)


def open_admin(settings: Settings) -> StoreAdmin:
    """The administrative view of the cache ``settings`` point at."""
    return StoreAdmin(
        open_index(settings), BlobStore(settings.blob_root), breaker_cooldown_s=settings.redis_retry
    )


def open_cache(settings: Settings, spec: KVSpec) -> BlockCache:
    """The serving prefix cache described by ``settings``, its garbage collector started. Never
    fails on an unreachable Redis: the cache starts degraded (serving misses) and resumes on its
    own when Redis answers."""
    budget = blob_budget(settings)
    cache = BlockCache(
        open_index(settings),
        BlobStore(settings.blob_root),
        spec,
        ttl_s=settings.ttl,
        max_bytes=budget,
        breaker_cooldown_s=settings.redis_retry,
        ram_bytes=settings.ram_cache_bytes,
        read_timeout_s=settings.cache_read_timeout,
        gc_grace_s=settings.gc_grace,
        pin_memory=torch.device(settings.device).type == "cuda",
    )
    cache.start_gc(settings.gc_interval)
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
