"""store/ against a real Redis (one server, a Cluster, Sentinel), on each blob backend (a
directory, an S3 bucket): save, then lookup finds, loads and verifies the chain."""

from __future__ import annotations

from functools import partial

import pytest
import redis
import torch

from hashing import BLOCK_SIZE, BlockHash, NamespaceIdentity, block_hashes
from store.cache import BlockCache
from store.entries import member_name, new_entry
from store.index.base import Publication
from store.index.memory.index import MemoryIndex
from store.index.redis.index import RedisIndex
from store.parts import CacheOptions
from tests.helpers import HANG_S, NS, SPEC, kv
from tests.s3_fixtures import read_object, stored_names, write_object
from tests.topology_fixtures import TOPOLOGIES, topology_url

IDS = list(range(3 * BLOCK_SIZE + 10))


@pytest.fixture(params=TOPOLOGIES)
def redis_url(request) -> str:
    """The index on one Redis, on a Redis Cluster and under Sentinel, in turn."""
    return topology_url(request)


@pytest.fixture
def make_cache(make_cache, blob_store):
    """Every cache of this module on each blob backend in turn."""
    return partial(make_cache, blobs=blob_store)


def test_saved_blocks_come_back_verified_in_order(make_cache, redis_client, key_prefix, tmp_path) -> None:
    """Three blocks saved; a lookup of the same tokens returns exactly them, bit for bit."""
    cache = make_cache(SPEC)
    key, value = kv(3)
    cache.save(NS, IDS, 0, key, value)
    assert cache.flush(HANG_S)
    match = cache.lookup(NS, IDS, max_blocks=3)
    assert [b.index for b in match.blocks] == [0, 1, 2] and match.num_tokens == 3 * BLOCK_SIZE
    assert torch.equal(torch.stack([b.key for b in match.blocks]), key)
    assert torch.equal(torch.stack([b.value for b in match.blocks]), value)
    assert cache.admin.stats().blocks_saved == 3


def test_index_entries_carry_a_ttl_and_only_metadata(make_cache, redis_client, key_prefix, tmp_path) -> None:
    """Block entries have a TTL and are small (no tensors in Redis)."""
    cache = make_cache(SPEC, ttl_s=123)
    cache.save(NS, IDS, 0, *kv(2))
    assert cache.flush(HANG_S)
    keys = list(redis_client.scan_iter(match=f"{key_prefix}*:b:*"))
    assert len(keys) == 2
    for k in keys:
        assert 0 < redis_client.ttl(k) <= 123
        assert len(redis_client.get(k)) < 400


def test_blob_files_are_where_the_design_says(make_cache, redis_client, key_prefix, tmp_path) -> None:
    """{blob root}/{ns}/{hash[:2]}/{hash}.safetensors, and no temporary file left behind."""
    cache = make_cache(SPEC)
    cache.save(NS, IDS, 0, *kv(1))
    assert cache.flush(HANG_S)
    h = block_hashes(IDS, NS)[0].hex()
    assert stored_names(cache.parts.blobs) == [f"{NS.hex()}/{h[:2]}/{h}.safetensors"]


def test_lookup_stops_at_the_first_missing_block(make_cache, redis_client, key_prefix, tmp_path) -> None:
    """Block 1's index entry deleted: only block 0 is served, block 2 is never loaded."""
    cache = make_cache(SPEC)
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    hashes = block_hashes(IDS, NS)
    redis_client.delete(cache.parts.index.block_key(NS, hashes[1]))
    assert [b.index for b in cache.lookup(NS, IDS, max_blocks=3).blocks] == [0]


def test_a_corrupt_blob_ends_the_prefix_and_drops_its_entry(
    make_cache, redis_client, key_prefix, tmp_path
) -> None:
    """Block 1's blob truncated: a miss from block 1 on, its entry removed and counted."""
    cache = make_cache(SPEC)
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    hashes = block_hashes(IDS, NS)
    blob = cache.parts.blobs.name(NS, hashes[1])
    write_object(cache.parts.blobs, blob, read_object(cache.parts.blobs, blob)[:1000])
    assert cache.lookup(NS, IDS, max_blocks=3).num_blocks == 1
    assert not redis_client.exists(cache.parts.index.block_key(NS, hashes[1]))
    assert cache.admin.stats().verification_failures == 1


def test_other_tokens_under_a_cached_prefix_miss_after_it(
    make_cache, redis_client, key_prefix, tmp_path
) -> None:
    """A prompt sharing only block 0 matches one block."""
    cache = make_cache(SPEC)
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    other = IDS[:BLOCK_SIZE] + [5] * (2 * BLOCK_SIZE)
    assert cache.lookup(NS, other, max_blocks=3).num_blocks == 1
    assert cache.lookup(NS, IDS, max_blocks=2).num_blocks == 2  # max_blocks caps the match


def test_unreachable_redis_is_a_miss_not_an_error(blob_store) -> None:
    """Redis down: lookup returns nothing, save writes nothing, health is degraded."""
    client = redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.2, socket_connect_timeout=0.2)
    cache = BlockCache(RedisIndex(client, "kvptest:"), blob_store, SPEC, CacheOptions(ttl_s=60))
    assert cache.lookup(NS, IDS, max_blocks=3).num_blocks == 0
    cache.save(NS, IDS, 0, *kv(1))
    assert cache.flush(HANG_S)
    assert cache.admin.health() == "degraded"
    assert stored_names(blob_store) == []


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_namespace_past_its_share_gives_up_its_own_blocks_first(redis_client, key_prefix, kind) -> None:
    """A tenant's namespace holding more than its share of the budget loses its own oldest blocks
    when the budget is full, however recently another tenant last used its own: one tenant's
    traffic does not evict another's prefixes. Without a share, the least recently used go."""
    for share, kept_b in ((300, 2), (None, 0)):
        index = MemoryIndex() if kind == "memory" else RedisIndex(redis_client, f"{key_prefix}{share}:")
        a, b = (NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant=t).digest() for t in "ab")
        for step, ns in enumerate([b, b, a, a, a, a, a, a]):  # b's two blocks are the oldest
            entry = new_entry(f"x/{step}", 100, None)
            index.publish(
                ns, [Publication(BlockHash(bytes([step]) * 16), None, 0, entry, 600, used_at=1000.0 + step)]
            )
        evicted = index.evict(600, share)
        assert index.total_bytes() == 600 and len(evicted) == 2
        assert sum(m.startswith(b.hex()) for batch in index.members() for m in batch) == kept_b


def test_the_byte_budget_is_global_over_namespaces(redis_client, key_prefix) -> None:
    """Namespaces live on their own slots (nodes, on a cluster), yet the budget counts them all
    and evicts the least recently used blocks first, whichever namespace holds them."""
    index = RedisIndex(redis_client, key_prefix)
    spaces = [
        NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant=t).digest()
        for t in ("a", "b", "c")
    ]
    order = []  # (namespace, hash) in order of use: oldest first
    for step in range(6):
        ns, h = spaces[step % 3], BlockHash(bytes([step]) * 16)
        index.publish(
            ns, [Publication(h, None, 0, new_entry(f"x/{step}", 100, None), 600, used_at=1000.0 + step)]
        )
        order.append(member_name(ns, h))
    assert index.total_bytes() == 600 and index.num_blocks() == 6
    assert index.evict(350) == order[:3]
    assert index.total_bytes() == 300 and sorted(m for batch in index.members() for m in batch) == sorted(
        order[3:]
    )
    assert index.evict(1000) == []
