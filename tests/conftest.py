"""Fixtures, all in one place: a real Redis (one of the run's own unless KVPROXY_TEST_REDIS_URL names
one; an own key prefix per test, cleaned up), the cache on it, tiny and
default models loaded once, test servers on real ports."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from engine.model.loading import LoadedModel, load_model
from proxy.app import create_app
from proxy.config import Settings, default_cache_dir
from store.blobs.base import BlobBackend
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.index.redis import connect
from store.index.redis.index import RedisIndex
from store.interface import KVSpec
from store.parts import CacheOptions
from tests.helpers import THINKING_CHATML, RedisServer, ServerThread, build_tiny_model, free_port

pytest_plugins = ["tests.s3_fixtures", "tests.topology_fixtures"]


@functools.cache
def shared_redis_url() -> str:
    """The Redis the tests share: ``KVPROXY_TEST_REDIS_URL``, else a server of this test run's own
    (``tests.helpers.RedisServer``), started on first use and stopped at exit."""
    if url := os.environ.get("KVPROXY_TEST_REDIS_URL"):
        return url
    server = RedisServer(free_port()).start()
    atexit.register(server.stop)
    return server.url


@pytest.fixture
def redis_url() -> str:
    """The Redis the test's cache uses: the shared server (a module may override this fixture
    with ``tests.topology_fixtures.TOPOLOGIES`` to run on a Cluster and Sentinel too)."""
    return shared_redis_url()


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    client = connect.redis_client(redis_url, 5.0)
    try:
        client.ping()
    except connect.REDIS_ERRORS as exc:
        pytest.fail(f"the tests' Redis at {redis_url} does not answer: {exc}")
    return client


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    prefix = f"kvptest-{uuid.uuid4().hex[:12]}:"
    yield prefix
    # NOTE: twice: a cache's background writer may still add a counter just after the test ends
    for pause in (0.1, 0.0):
        keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            redis_client.delete(*keys)
        time.sleep(pause)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A 2-layer random Llama with a byte-level BPE tokenizer, served as ``tiny``."""
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    return dataclasses.replace(loaded, name="tiny")


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny model with a reasoning-style template (``tests.helpers.THINKING_CHATML``), served
    as ``tiny``."""
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-thinking"), chat_template=THINKING_CHATML)
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    return dataclasses.replace(loaded, name="tiny")


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    """SmolLM2-135M-Instruct, fetched and converted once into the user's kvproxy cache dir."""
    cache_dir = Path(os.environ.get("KVPROXY_CACHE_DIR", default_cache_dir()))
    return load_model("smollm2-135m-instruct", cache_dir=cache_dir)


@pytest.fixture
def make_cache(redis_client: redis.Redis, key_prefix: str, tmp_path: Path) -> Callable[..., BlockCache]:
    """Build a BlockCache on the real Redis under this test's prefix and a temp blob dir (or the
    blob store given), for a model's K/V layout or a given ``KVSpec``."""

    def make(
        layout: LoadedModel | KVSpec, ttl_s: int = 600, blobs: BlobBackend | None = None, **options: Any
    ) -> BlockCache:
        spec = layout if isinstance(layout, KVSpec) else layout.kv_spec
        index = RedisIndex(redis_client, key_prefix)
        blobs = blobs if blobs is not None else FileBlobStore(tmp_path / "blobs")
        return BlockCache(index, blobs, spec, CacheOptions(ttl_s=ttl_s, **options))

    return make


@pytest.fixture
def settings(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    """Settings of a test server: this test's Redis (``redis_url``), key prefix and blob dir; its
    admin routes open to anonymous clients (``--allow-anonymous-admin``: one test, one user).

    NOTE: a Redis reply or a blob read later than the defaults (0.25 s, 5 s) is a fault that turns
    hits into misses; on a loaded machine that would fail tests that count hits, so here they are
    bounds on a hang. Tests of those faults set their own."""
    return Settings(
        redis_url=redis_url,
        key_prefix=key_prefix,
        blob_dir=tmp_path / "blobs",
        cache_dir=tmp_path,
        allow_anonymous_admin=True,
        redis_timeout=5.0,
        cache_read_timeout=30.0,
    )


@pytest.fixture
def serve() -> Callable[..., ServerThread]:
    """Start ``create_app(settings, model)`` on a real HTTP port; use as a context manager."""

    def start(settings: Settings, model: LoadedModel) -> ServerThread:
        return ServerThread(create_app(settings, model))

    return start


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip cleanly on a machine without a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)
