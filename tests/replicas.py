"""Replicas behind real routers, for the tests that route: three tiny-model ``kvproxy serve``
apps (``cluster``) or fake upstreams (``routed``), and the seeded prose their prompts are made of
(``text``)."""

from __future__ import annotations

import random
import time
from contextlib import ExitStack, contextmanager

import httpx

from proxy.app import create_app
from proxy.router.app import create_route_app
from proxy.router.identity import Identity
from proxy.router.settings import RouteSettings
from tests.conftest import shared_redis_url
from tests.fake_upstream import fake_upstream
from tests.helpers import TRAINING_TEXT, ServerThread

WORDS = " ".join(TRAINING_TEXT).split()


def text(seed: int, words: int) -> str:
    """Seeded prose of the tiny tokenizer's words (about 1.6 tokens a word)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def replica_app(settings, tiny_model, i: int, tmp_path):
    """Replica ``i``'s ``kvproxy serve`` app on the tiny model, with a cache of its own (key prefix,
    blob directory) on the shared Redis."""
    own = {"key_prefix": f"{settings.key_prefix}r{i}:", "blob_dir": tmp_path / f"blobs-{i}"}
    return create_app(settings.model_copy(update=own), tiny_model)


@contextmanager
def cluster(settings, tiny_model, tmp_path, routers=1, hashing="tokens", **options):
    """Three fresh replicas behind ``routers`` routers on one Redis, hashing prompts as token ids
    (the tiny model's tokenizer) or as text (``options``: more of the routers' settings, or other
    values, such as ``redis_url="memory://"`` for routers without Redis); yields (routers,
    replicas)."""
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(ServerThread(replica_app(settings, tiny_model, i, tmp_path)))
            for i in range(3)
        ]
        given = {
            "upstream": ",".join(f"{r.base_url}/v1" for r in replicas),
            "redis_url": settings.redis_url,
            "key_prefix": f"{settings.key_prefix}route:",
            "health_interval": 0.5,
        }
        route = RouteSettings(**(given | options))
        identity = Identity(tiny_model.tokenizer, "tiny") if hashing == "tokens" else Identity(None)
        fronts = [
            stack.enter_context(ServerThread(create_route_app(route, identity))) for _ in range(routers)
        ]
        for front in fronts:
            wait_until_all_up(front)
        yield fronts, replicas


def wait_until_all_up(router, within_s: float = 30) -> None:
    """Until ``router`` sees every replica up: a start-up probe slowed past its 2 s by a loaded
    machine marks a replica down until the next probe."""
    deadline = time.monotonic() + within_s
    while not all(httpx.get(f"{router.base_url}/health", timeout=10).json()["replicas"].values()):
        assert time.monotonic() < deadline, "the router never saw every replica up"
        time.sleep(0.1)


@contextmanager
def routed(key_prefix: str, names=("a", "b"), extra_urls=(), **options):
    """Fake upstreams ``names`` (plus ``extra_urls``) behind a router; yields (router, upstreams)."""
    with ExitStack() as stack:
        upstreams = {n: stack.enter_context(ServerThread(fake_upstream(n))) for n in names}
        urls = [f"{u.base_url}/v1" for u in upstreams.values()] + list(extra_urls)
        settings = RouteSettings(
            upstream=",".join(urls),
            redis_url=shared_redis_url(),
            key_prefix=key_prefix,
            health_interval=0.2,
            replica_cooldown=2.0,
            **({"first_byte_timeout": 1.0} | options),
        )
        router = stack.enter_context(ServerThread(create_route_app(settings)))
        yield router, upstreams
