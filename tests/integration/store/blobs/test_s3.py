"""Blobs in S3 behind a real server (moto's S3 over HTTP, real Redis, tiny model): a hit survives a
restart and is shared between servers with identical output; a damaged object is a miss and is
replaced; the collector reclaims unindexed objects it finds by listing."""

from __future__ import annotations

import time

import pytest

from hashing import block_hashes
from store.blobs.s3 import S3BlobStore, s3_client
from store.serde import read_token_ids
from tests.api import Api
from tests.helpers import random_tokens
from tests.s3_fixtures import read_object, stored_names, write_object

P = random_tokens(300, seed=81)  # 300 prompt + 8 generated tokens: two full blocks, two tails


@pytest.fixture
def s3_settings(settings, s3_bucket):
    """The test server's settings with blobs under ``s3://{bucket}/kvp`` and no RAM tier (every hit
    reads S3)."""
    update = {
        "blob_dir": None,
        "blob_url": f"s3://{s3_bucket}/kvp",
        "max_cache_bytes": 10**9,
        "ram_cache_bytes": 0,
    }
    return settings.model_copy(update=update)


@pytest.fixture
def bucket_blobs(s3_bucket) -> S3BlobStore:
    """The same objects as the servers see them, for inspecting and damaging."""
    return S3BlobStore(s3_bucket, "kvp", s3_client(read_timeout_s=10))


def test_a_hit_survives_a_restart_with_identical_output(s3_settings, tiny_model, serve, cold, bucket_blobs):
    """Served, stopped, started again on the same bucket and Redis prefix: 299 cached tokens (the
    blocks and the prompt's tail) and the uncached answer."""
    with serve(s3_settings, tiny_model) as server:
        api = Api(server)
        first = api.complete(P)
        api.flush()
        namespace = api.engine.loaded.namespace("default")
    assert first.cached_tokens == 0
    blocks = {bucket_blobs.name(namespace, h) for h in block_hashes(P, namespace)}
    stored = stored_names(bucket_blobs)
    assert blocks <= set(stored) and len(stored) == len(blocks) + 2  # the prompt's and the answer's tails
    with serve(s3_settings, tiny_model) as server:
        again = Api(server).complete(P)
    assert again.cached_tokens == len(P) - 1
    assert again.key == first.key == cold.complete(P).key


def test_two_servers_share_hits(s3_settings, tiny_model, serve):
    """A prefix stored by one server is a hit on another running at the same time."""
    with serve(s3_settings, tiny_model) as a, serve(s3_settings, tiny_model) as b:
        first = Api(a).complete(P)
        Api(a).flush()
        hit = Api(b).complete(P)
        assert (first.cached_tokens, hit.cached_tokens) == (0, len(P) - 1)
        assert hit.key == first.key
        assert Api(b).cache.admin.stats().blocks_saved == 0  # nothing written twice


def test_a_damaged_object_is_a_miss_and_is_replaced(s3_settings, tiny_model, serve, cold, bucket_blobs):
    """Block 1's object overwritten with garbage outside kvproxy: the prefix ends at block 1 (same
    answer), the failure is counted, and the request's save puts a good object back."""
    with serve(s3_settings, tiny_model) as server:
        api = Api(server)
        api.complete(P)
        api.flush()
        namespace = api.engine.loaded.namespace("default")
        name = bucket_blobs.name(namespace, block_hashes(P, namespace)[1])
        write_object(bucket_blobs, name, b"garbage" * 100)

        damaged = api.complete(P)
        assert damaged.status == 200 and damaged.cached_tokens == 128
        assert damaged.key == cold.complete(P).key
        assert api.cache.admin.stats().verification_failures == 1
        api.flush()
        assert read_token_ids(read_object(bucket_blobs, name)) == P[128:256]  # a whole block again

        healed = api.complete(P)
        assert healed.cached_tokens == len(P) - 1 and healed.key == damaged.key
        assert api.cache.admin.stats().verification_failures == 1


def test_gc_reclaims_unindexed_objects_by_listing(s3_settings, tiny_model, serve, bucket_blobs, redis_client):
    """A stray object (no entry) survives a collection while young and goes once older than grace;
    a chain whose head entry is gone loses every object; indexed objects stay."""
    with serve(s3_settings.model_copy(update={"gc_interval": 3600}), tiny_model) as server:
        api = Api(server)
        api.complete(P)
        api.flush()
        namespace = api.engine.loaded.namespace("default")
        hashes = block_hashes(P, namespace)
        stray = f"{namespace.hex()}/ff/{'ff' * 16}.safetensors"
        write_object(bucket_blobs, stray, read_object(bucket_blobs, bucket_blobs.name(namespace, hashes[0])))
        assert api.cache.admin.gc(grace_s=60).unindexed_blobs == 0 and stray in stored_names(bucket_blobs)
        time.sleep(0.2)
        assert api.cache.admin.gc(grace_s=0.1).unindexed_blobs == 1 and stray not in stored_names(
            bucket_blobs
        )
        assert api.complete(P).cached_tokens == len(P) - 1  # indexed objects untouched

        redis_client.delete(api.cache.parts.index.block_key(namespace, hashes[0]))  # as if it expired
        report = api.cache.admin.gc(grace_s=0)
        assert (report.expired, report.orphans) == (1, 3)  # block 1, then the two tails after it
        assert stored_names(bucket_blobs) == [] and api.cache.parts.index.total_bytes() == 0
