"""Hot prefixes against a real Redis (one server and a Cluster): counted hits are recorded on the
writer's thread, listed by tokens saved with their TTL left, and forgotten once they expire."""

from __future__ import annotations

import json
import time

import pytest

from hashing import BLOCK_SIZE, NamespaceIdentity, block_hashes
from store.index.redis.keys import IndexKeys
from tests.helpers import HANG_S, NS, SPEC, kv
from tests.topology_fixtures import topology_url

IDS = list(range(3 * BLOCK_SIZE + 10))
OTHER = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="other").digest()


@pytest.fixture(params=["redis", "cluster"])
def redis_url(request) -> str:
    """One Redis, then a Redis Cluster (every hot key of a namespace in its slot)."""
    return topology_url(request)


def test_hits_rank_prefixes_by_tokens_saved(make_cache, redis_client, key_prefix) -> None:
    """Two hits on 3 blocks and one on 2: two prefixes, the 3-block one first, with exact hits,
    tokens saved, length, bytes, TTL left and block 0's token ids for the readable namespace."""
    cache = make_cache(SPEC, ttl_s=600)
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    cache.lookup(NS, IDS)
    since = time.monotonic()  # NOTE: block 2's TTL counts down from here, however slow the steps
    cache.lookup(NS, IDS)
    cache.lookup(NS, IDS[: 2 * BLOCK_SIZE + 5])
    cache.lookup(NS, IDS, count=False)  # a prewarm is not a hit
    cache.lookup(NS, [7] * 300)  # a miss records nothing
    assert cache.flush(HANG_S)

    hashes = block_hashes(IDS, NS)
    size = json.loads(redis_client.get(IndexKeys(key_prefix).block(NS, hashes[2])))["bytes"]
    rows = cache.admin.hot_prefixes(NS, readable=NS)
    passed = time.monotonic() - since + 1  # NOTE: + 1 s: Redis rounds a TTL to the second
    assert [(r.hits, r.tokens_saved, r.blocks, r.cached_tokens) for r in rows] == [
        (2, 2 * 384, 3, 384),
        (1, 256, 2, 256),
    ]
    assert rows[0].bytes == 3 * size and rows[0].namespace == NS.hex()
    assert 600 - passed <= rows[0].ttl_seconds <= 600
    assert rows[0].token_ids == rows[1].token_ids == IDS[:BLOCK_SIZE]
    assert [r.token_ids for r in cache.admin.hot_prefixes(NS)] == [None, None]  # not the viewer's


def test_expired_prefixes_are_skipped_and_forgotten(make_cache, redis_client, key_prefix) -> None:
    """The TTL shown is the last block's; once that block's entry is gone the prefix is left out
    and removed from the sorted set, and other namespaces are listed for the deployment."""
    cache = make_cache(SPEC, ttl_s=600)
    cache.save(NS, IDS, 0, *kv(3))
    cache.save(OTHER, IDS, 0, *kv(1))
    assert cache.flush(HANG_S)
    cache.lookup(NS, IDS)
    since = time.monotonic()  # NOTE: the TTLs shown count down from here, however slow the steps
    cache.lookup(NS, IDS[: BLOCK_SIZE + 5])
    cache.lookup(OTHER, IDS)
    assert cache.flush(HANG_S)
    keys = IndexKeys(key_prefix)
    hashes = block_hashes(IDS, NS)
    redis_client.expire(keys.block(NS, hashes[2]), 42)
    shown = [r.ttl_seconds for r in cache.admin.hot_prefixes(NS)]
    passed = time.monotonic() - since + 1  # NOTE: + 1 s: Redis rounds a TTL to the second
    assert len(shown) == 2 and 42 - passed <= shown[0] <= 42 and 600 - passed <= shown[1] <= 600

    redis_client.delete(keys.block(NS, hashes[2]))  # as if its TTL ran out
    assert [r.blocks for r in cache.admin.hot_prefixes(NS)] == [1]
    members = redis_client.zrange(keys.of(NS.hex(), "hot"), 0, -1)
    assert members == [hashes[0].hex().encode()]
    assert redis_client.hkeys(keys.of(NS.hex(), "hot:hits")) == members
    everyone = {(r.namespace, r.blocks) for r in cache.admin.hot_prefixes(None)}
    assert everyone == {(NS.hex(), 1), (OTHER.hex(), 1)}


def test_tenant_rates_per_namespace(make_cache) -> None:
    """Each namespace's prompt and cached tokens, all time and over the last hour."""
    cache = make_cache(SPEC, ttl_s=600)
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    cache.lookup(NS, IDS)
    cache.lookup(OTHER, IDS)
    assert cache.flush(HANG_S)
    rows = {r.namespace: r for r in cache.admin.tenant_rates([OTHER])}
    assert rows[NS.hex()].prompt_tokens == len(IDS) and rows[NS.hex()].cached_tokens == 384
    assert rows[NS.hex()].last_hour.hit_rate == 384 / len(IDS)
    assert rows[OTHER.hex()].hit_rate == 0.0  # known, never published: listed from ``known``
