"""Cache lifecycle: sliding TTL, retention, whole-chain expiry, byte budget (LRU), garbage
collection, administration. Real Redis, tiny model, real HTTP; each blob backend in turn."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import httpx
import pytest
import redis

from hashing import block_hashes
from proxy.stores import open_blobs
from tests.api import Api
from tests.helpers import RedisServer, free_port, random_tokens, wait_for
from tests.s3_fixtures import BACKENDS, read_object, stored_names, write_object
from tests.topology_fixtures import TOPOLOGIES, topology_url

P = random_tokens(300, seed=61)  # 300 prompt + 8 generated tokens: two full blocks
P_TAILS = 2
"""Tails P stores after its two blocks (``hashing.tails``): its own 44 tokens, and the 52 of
prompt + answer."""
TTL = 8


@pytest.fixture(params=TOPOLOGIES)
def redis_url(request) -> str:
    """The index on one Redis, on a Redis Cluster and under Sentinel, in turn."""
    return topology_url(request)


@pytest.fixture(params=BACKENDS)
def settings(settings, request):
    """Blobs in the test's directory, then under ``s3://{a bucket of the test's own}/kvp``."""
    if request.param == "file":
        return settings
    bucket = request.getfixturevalue("s3_bucket")
    return settings.model_copy(
        update={"blob_dir": None, "blob_url": f"s3://{bucket}/kvp", "max_cache_bytes": 10**9}
    )


def block_keys(redis_client, key_prefix):
    return list(redis_client.scan_iter(match=f"{key_prefix}*:b:*"))


def files(settings):
    """Every object in the blob store, whatever its name."""
    return stored_names(open_blobs(settings))


def test_hits_slide_the_ttl_then_the_chain_expires_whole(
    settings, tiny_model, serve, redis_client, key_prefix
):
    """TTL 8 s: hits 4.4 s and 8.8 s after storing keep the blocks (the second only because the
    first refreshed them); without hits the whole chain expires; after a collection the disk and
    the index's accounting are back to their baseline.

    NOTE: each hit must come within the TTL of the one before; 8 s leaves each request 3.6 s,
    however slow the machine. The expiry is waited for: a slow machine only waits longer."""
    with serve(settings.model_copy(update={"ttl": TTL, "gc_interval": 3600}), tiny_model) as server:
        api = Api(server)
        api.complete(P)
        api.flush()
        stored = time.monotonic()  # the blocks were published before this
        ttls = [redis_client.ttl(k) for k in block_keys(redis_client, key_prefix)]
        assert len(ttls) == 2 + P_TAILS and all(0 < t <= TTL for t in ttls)
        time.sleep(TTL * 0.55)
        assert api.complete(P).cached_tokens == len(P) - 1  # the 2 blocks, then P's own tail
        time.sleep(max(0.0, stored + TTL * 1.1 - time.monotonic()))
        # more than the TTL after storing: alive only because the hit refreshed it
        assert api.complete(P).cached_tokens == len(P) - 1
        api.flush()  # NOTE: a tail that expired meanwhile is stored again, with its own TTL
        wait_for(lambda: block_keys(redis_client, key_prefix) == [], what="the chain to expire")
        report = api.cache.admin.gc(grace_s=0)
        assert report.expired == 2 + P_TAILS
        assert files(settings) == [] and api.cache.parts.index.total_bytes() == 0
        assert api.cache.parts.index.num_blocks() == 0
        assert api.complete(P).cached_tokens == 0


def test_retention_24h_is_granted_up_to_max_ttl(settings, tiny_model, serve, redis_client, key_prefix):
    """prompt_cache_retention=24h gets min(86400, --max-ttl); a default hit never shortens it."""
    with serve(settings.model_copy(update={"ttl": 5, "max_ttl": 50}), tiny_model) as server:
        api = Api(server)
        api.complete(P, prompt_cache_retention="24h")
        api.flush()
        assert all(5 < redis_client.ttl(k) <= 50 for k in block_keys(redis_client, key_prefix))
        api.complete(P)
        assert all(5 < redis_client.ttl(k) <= 50 for k in block_keys(redis_client, key_prefix))
        bad = httpx.post(
            f"{server.base_url}/v1/completions",
            json={"model": "tiny", "prompt": P, "prompt_cache_retention": "forever"},
        )
        assert bad.status_code == 400


def test_orphaned_descendants_are_never_served_and_are_reclaimed(cached, settings, redis_client):
    """Block 0's entry gone: blocks 1 and 2 (and the tails after block 2) can never be served; gc
    removes them and their blobs."""
    prompt = random_tokens(3 * 128 + 30, seed=62)
    cached.complete(prompt)
    cached.flush()
    namespace = cached.engine.loaded.namespace("default")
    hashes = block_hashes(prompt, namespace)
    redis_client.delete(cached.cache.parts.index.block_key(namespace, hashes[0]))  # as if it expired
    assert cached.cache.lookup(namespace, prompt, 3).num_blocks == 0
    report = cached.cache.admin.gc(grace_s=0)
    # orphans: blocks 1 and 2, and the 2 tails after block 2 (the prompt's last 30 tokens; those
    # and its 8-token answer)
    assert (report.expired, report.orphans) == (1, 2 + 2)
    assert files(settings) == [] and cached.cache.parts.index.total_bytes() == 0


def test_byte_budget_evicts_least_recently_used_tail_first(cached, settings):
    """Budget of 4 blocks: A, B stored, A hit, C stored -> B goes (tail first), A stays. Every
    tail (``hashing.tails``: 2 per request here) is evicted before any block: at a budget of
    A's and B's 4 blocks, each goes as soon as it is stored.

    NOTE: compressed blobs differ a little in size, so the budget is those 4 blobs' bytes and a
    fifth of a block more: less than any tail, more than blocks differ by."""
    a, b, c = (random_tokens(300, seed=s) for s in (71, 72, 73))
    cached.complete(a)
    cached.complete(b)
    cached.flush()
    namespace = cached.engine.loaded.namespace("default")
    four = [h for p in (a, b) for h in block_hashes(p, namespace)]
    sizes = [cached.cache.parts.blobs.size(namespace, h) or 0 for h in four]
    budget = sum(sizes) + sum(sizes) // 20
    cached.cache.writer.options = dataclasses.replace(cached.cache.writer.options, max_bytes=budget)
    cached.cache.writer.evict_to_budget()
    stats = cached.cache.admin.stats()
    assert cached.cache.parts.index.num_blocks() == 4  # blocks only: A's and B's tails all went first
    assert (stats.evicted_budget, stats.tails_saved) == (4, 4)
    cached.complete(a)  # A is now more recently used than B
    cached.complete(c[:200])  # one new block: B's tail must go
    cached.flush()
    hb = block_hashes(b, namespace)
    stats = cached.cache.admin.stats()
    assert (stats.evicted_budget, stats.tails_saved) == (1 + 8, 8)  # one block, and every tail
    assert cached.cache.parts.index.num_blocks() == 4
    assert not cached.cache.parts.blobs.exists(namespace, hb[1])
    assert cached.cache.parts.blobs.exists(namespace, hb[0])
    assert cached.cache.parts.index.total_bytes() <= budget
    assert cached.cache.lookup(namespace, a, 2).num_blocks == 2
    cached.complete(c)  # C's second block: B's head goes next
    cached.flush()
    stats = cached.cache.admin.stats()
    assert (stats.evicted_budget, stats.tails_saved) == (2 + 10, 10)  # two blocks, and every tail
    assert cached.cache.lookup(namespace, b, 2).num_blocks == 0
    assert cached.cache.parts.index.total_bytes() <= budget


def test_gc_removes_unindexed_blobs_after_the_grace_period_only(cached, settings):
    """A stray blob (no entry) survives a collection while young and goes once older than grace."""
    cached.complete(P)
    cached.flush()
    blobs = open_blobs(settings)
    blob = next(name for name in files(settings) if name.endswith(".safetensors"))
    stray = blob.rsplit("/", 1)[0] + "/" + "ff" * 16 + ".safetensors"
    write_object(blobs, stray, read_object(blobs, blob))
    assert cached.cache.admin.gc(grace_s=60).unindexed_blobs == 0 and stray in files(settings)
    time.sleep(0.2)
    assert cached.cache.admin.gc(grace_s=0.1).unindexed_blobs == 1 and stray not in files(settings)
    assert cached.complete(P).cached_tokens == len(P) - 1  # indexed blobs (blocks, tail) untouched


def test_admin_routes_need_the_admin_key(settings, tiny_model, serve):
    """GET /v1/cache/stats and POST /v1/cache/clear: 401 without the key, then work with it."""
    with serve(settings.model_copy(update={"admin_key": "s3cret"}), tiny_model) as server:
        api, url = Api(server), server.base_url
        api.complete(P)
        api.flush()
        assert httpx.get(f"{url}/v1/cache/stats").status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        stats = httpx.get(f"{url}/v1/cache/stats", headers=auth).json()
        # the index's entries: 2 blocks and P's tails
        assert stats["deployment"]["blocks"] == 2 + P_TAILS and stats["process"]["cache"]["blocks_saved"] == 2
        assert stats["process"]["cache"]["tails_saved"] == P_TAILS
        assert (
            httpx.post(f"{url}/v1/cache/clear", headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        assert httpx.post(f"{url}/v1/cache/clear", headers=auth, timeout=120).json() == {
            "removed_blocks": 2 + P_TAILS,
            "removed_named_caches": 0,
        }
        assert files(settings) == [] and api.complete(P).cached_tokens == 0


def test_cli_stats_gc_clear(cached, settings, key_prefix):
    """`kvproxy cache stats|gc|clear` on the same Redis and blob store."""
    cached.complete(P)
    cached.flush()
    flags = [
        "--redis-url",
        settings.redis_url,
        "--key-prefix",
        key_prefix,
        *(
            ["--blob-dir", str(settings.blob_root)]
            if settings.blob_url is None
            else ["--blob-url", settings.blob_url]
        ),
    ]

    def cli(*args: str) -> str:
        cmd = [sys.executable, "-m", "proxy.cli", "cache", *args, *flags]
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout

    assert f'"blocks": {2 + P_TAILS}' in cli("stats")  # 2 blocks and P's tails
    assert '"unindexed_blobs": 0' in cli("gc")
    namespace = cached.engine.loaded.namespace("default").hex()
    assert cli("clear", "--namespace", "0" * 32) == '{"removed_blocks": 0, "removed_named_caches": 0}\n'
    cleared = cli("clear", "--namespace", namespace)
    assert cleared == f'{{"removed_blocks": {2 + P_TAILS}, "removed_named_caches": 0}}\n'
    assert files(settings) == []


def test_cli_gc_and_clear_say_so_when_redis_fails_after_the_ping(tmp_path):
    """A Redis that answers PING and refuses everything else (an ACL user allowed PING only):
    `kvproxy cache gc` and `clear` exit 1 with a message, never a traceback."""
    server = RedisServer(free_port()).start()
    try:
        redis.Redis(port=server.port).acl_setuser("pinger", enabled=True, nopass=True, commands=["+ping"])
        flags = ["--redis-url", f"redis://pinger@127.0.0.1:{server.port}/0", "--blob-dir", str(tmp_path)]
        for args in (["gc"], ["clear"]):
            done = subprocess.run(
                [sys.executable, "-m", "proxy.cli", "cache", *args, *flags],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
            assert "Redis stopped answering" in done.stderr
    finally:
        server.stop()
