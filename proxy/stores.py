"""The one place stores are opened from settings: the cache (the index, the blob store, the
budget) and the two stores of state beside it, named caches and stored responses.

``open_cache`` builds the serving cache (``kvproxy serve``); ``open_admin`` the administrative
view the ``kvproxy cache`` commands use (no model needed). ``open_named`` and ``open_responses``
open the state stores ``--redis-url`` names through registries of URL schemes
(``store.open.Registry``, as the block index is opened): in this process for ``memory://``, else
on Redis with their own timeout (``proxy.config.state_timeout``).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from urllib.parse import urlsplit

import redis
import torch

from proxy.config import Settings, state_timeout
from proxy.named.registry import MemoryNamedCaches, NamedCaches, RedisNamedCaches
from proxy.responses.state import MemoryResponses, RedisResponses, ResponseStore
from store import open as store_open
from store.admin import StoreAdmin
from store.blobs.base import BlobBackend
from store.blobs.file import FileBlobStore
from store.blobs.tiered import TieredBlobStore
from store.cache import BlockCache
from store.index.base import BlockIndex
from store.index.redis.connect import redact_url, redis_client
from store.index.redis.faults import RedisPlace, ping_fault
from store.index.redis.schemes import SCHEMES as REDIS_SCHEMES
from store.interface import KVSpec
from store.open import Registry
from store.parts import CacheOptions, StoreParts

log = logging.getLogger(__name__)

RAM_BLOCKS_WARNING = 16
"""A RAM tier holding fewer blocks than this (2,048 tokens) is worth a warning at start."""


def blob_budget(settings: Settings) -> int:
    """``--max-cache-bytes``, or half of the free disk under the blob directory now (bytes).

    Raises:
        ValueError: blobs on S3 and no ``--max-cache-bytes`` (a bucket has no free space to halve).
    """
    if settings.max_cache_bytes is not None:
        return settings.max_cache_bytes
    if urlsplit(settings.blob_location).scheme == "s3":
        raise ValueError(
            f"--blob-url {redact_url(settings.blob_location)} needs a byte budget: set --max-cache-bytes "
            "(KVPROXY_MAX_CACHE_BYTES), e.g. 100GB"
        )
    settings.blob_root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(settings.blob_root).free // 2


def open_index(settings: Settings) -> BlockIndex:
    """The block index ``--redis-url`` names (``store.open``), every Redis operation failing
    within ``--redis-timeout`` seconds; nothing is contacted yet.

    Raises:
        ValueError: a URL that cannot be used.
    """
    return store_open.open_index(
        settings.redis_url, key_prefix=settings.key_prefix, timeout_s=settings.redis_timeout
    )


def open_blobs(settings: Settings) -> BlobBackend:
    """The blob store ``--blob-url`` (or ``--blob-dir``) names, reads timing out after
    ``--cache-read-timeout`` seconds, behind the disk tier ``--blob-disk-cache`` names if any (whose
    directory is scanned once now); nothing remote is contacted yet."""
    blobs = store_open.open_blobs(settings.blob_location, read_timeout_s=settings.cache_read_timeout)
    if settings.blob_disk_cache is None:
        return blobs
    local = FileBlobStore(settings.blob_disk_cache)
    return TieredBlobStore(blobs, local, budget_bytes=settings.blob_disk_cache_bytes)


def redis_place(settings: Settings) -> RedisPlace:
    """``--redis-url`` (redacted) and ``--redis-timeout``, as Redis warnings name them."""
    return RedisPlace(redact_url(settings.redis_url), settings.redis_timeout)


def redis_trouble(settings: Settings) -> str:
    """Why Redis does not answer now, for an operator: too slow, not there, refused credentials
    (``store.index.redis.faults``); asked with one PING of its own."""
    place = redis_place(settings)
    fault = ping_fault(redis_client(settings.redis_url, settings.redis_timeout), place)
    return str(fault) if fault is not None else f"{place.name} did not answer a moment ago"


def open_admin(settings: Settings) -> StoreAdmin:
    """The administrative view of the cache ``settings`` point at (no model, no writer)."""
    parts = StoreParts.open(
        open_index(settings),
        open_blobs(settings),
        cooldown_s=settings.redis_retry,
        redis=redis_place(settings),
    )
    return StoreAdmin(parts, cache_options(settings, budget=None))


def cache_options(settings: Settings, budget: int | None) -> CacheOptions:
    """The serving cache's knobs from ``settings``, with the byte budget ``budget``."""
    return CacheOptions(
        ttl_s=settings.ttl,
        max_bytes=budget,
        namespace_max_bytes=None if budget is None else settings.tenant_budget(budget),
        breaker_cooldown_s=settings.redis_retry,
        ram_bytes=settings.ram_cache_bytes,
        read_timeout_s=settings.cache_read_timeout,
        gc_grace_s=settings.gc_grace,
        pin_memory=torch.device(settings.device).type == "cuda",
        tails=not settings.no_tails,
        redis=redis_place(settings),
    )


def open_cache(settings: Settings, spec: KVSpec) -> BlockCache:
    """The serving prefix cache described by ``settings``, its garbage collector started. Never
    fails on an unreachable Redis: the cache starts degraded (serving misses) and resumes on its
    own when Redis answers."""
    budget, blobs = blob_budget(settings), open_blobs(settings)
    try:
        blobs.check()
    except OSError as exc:
        log.warning("blob store %s is unreachable (%s): every save fails until it answers", blobs.url, exc)
    cache = BlockCache(open_index(settings), blobs, spec, cache_options(settings, budget))
    cache.admin.start_gc(settings.gc_interval)
    ram_blocks = settings.ram_cache_bytes // spec.block_bytes
    log.info(
        "blob store %s: budget %.1f MB (--max-cache-bytes); RAM tier %.1f MB, %d blocks (--ram-cache-bytes)",
        redact_url(settings.blob_location),
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
    # NOTE: one probe now: a Redis fault is logged once, by the cache's guard, with what to do
    cache.admin.health()
    return cache


NamedFactory = Callable[[Settings], NamedCaches]
ResponsesFactory = Callable[[Settings], ResponseStore]
NAMED: Registry[NamedFactory] = Registry("named cache store")
RESPONSES: Registry[ResponsesFactory] = Registry("response store")


def state_client(settings: Settings) -> redis.Redis:
    """A client of the Redis ``--redis-url`` names for state (named caches, stored responses):
    every operation fails within ``state_timeout`` seconds; nothing is contacted yet."""
    return redis_client(settings.redis_url, state_timeout(settings))


@NAMED.register("memory")
def _memory_named(_settings: Settings) -> NamedCaches:
    return MemoryNamedCaches()


@NAMED.register(*REDIS_SCHEMES)
def _redis_named(settings: Settings) -> NamedCaches:
    return RedisNamedCaches(state_client(settings), settings.key_prefix)


@RESPONSES.register("memory")
def _memory_responses(settings: Settings) -> ResponseStore:
    budget = settings.responses_max_bytes
    return MemoryResponses(settings.responses_ttl, budget, settings.tenant_budget(budget))


@RESPONSES.register(*REDIS_SCHEMES)
def _redis_responses(settings: Settings) -> ResponseStore:
    ttl, budget = settings.responses_ttl, settings.responses_max_bytes
    share = settings.tenant_budget(budget)
    return RedisResponses(state_client(settings), settings.key_prefix, ttl, budget, share)


def open_named(settings: Settings) -> NamedCaches:
    """The named caches ``--redis-url`` names (in this process for ``memory://``); nothing is
    contacted yet."""
    return NAMED.factory(settings.redis_url)(settings)


def open_responses(settings: Settings) -> ResponseStore:
    """The response store ``--redis-url`` names (in this process for ``memory://``), with
    ``--responses-ttl`` and ``--responses-max-bytes``, of which a tenant holds its share
    (``Settings.tenant_budget``); nothing is contacted yet."""
    return RESPONSES.factory(settings.redis_url)(settings)
