"""Retention classes under the byte budget, on real Redis (its Lua scripts) and on the in-memory
double alike: blocks stored with a 5-minute TTL go before the server's hour, which goes before a
day's retention, whatever the order they were stored or used in; a hit that promises a block
longer moves it up. No model."""

from __future__ import annotations

import pytest
import torch

from hashing import BLOCK_SIZE, block_hashes
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.index.memory.index import MemoryIndex
from store.index.redis.index import RedisIndex
from store.index.retention import retention_class
from store.parts import CacheOptions
from tests.helpers import HANG_S, NS, SPEC, kv

TTLS = {"short": 300, "standard": 3600, "long": 86400}


@pytest.fixture(params=["memory", "redis"])
def cache(request, redis_client, key_prefix, tmp_path) -> BlockCache:
    index = MemoryIndex() if request.param == "memory" else RedisIndex(redis_client, key_prefix)
    return BlockCache(index, FileBlobStore(tmp_path), SPEC, CacheOptions(ttl_s=3600))


def chain(seed: int) -> list[int]:
    return [seed * 1000 + i for i in range(2 * BLOCK_SIZE)]


def held(cache: BlockCache) -> dict[str, int]:
    """Blocks still indexed, per class."""
    found = {}
    for name in TTLS:
        found[name] = sum(
            len(cache.parts.index.match(NS, block_hashes(chain(seed), NS), [1, 1]).entries)
            for seed in seeds(name)
        )
    return found


def seeds(name: str) -> range:
    start = list(TTLS).index(name) * 10
    return range(start, start + 3)


def test_the_budget_evicts_the_lowest_class_first(cache) -> None:
    """Three chains of each class, stored long first (the oldest): a budget of five chains
    evicts every short block and one standard chain, not one long block."""
    for name in ("long", "standard", "short"):
        for seed in seeds(name):
            cache.save(NS, chain(seed), 0, *kv(2), ttl_s=TTLS[name])
    assert cache.flush(HANG_S)
    index = cache.parts.index
    per_chain = index.total_bytes() // 9
    index.evict(5 * per_chain)
    assert held(cache) == {"short": 0, "standard": 4, "long": 6}
    index.evict(2 * per_chain)
    assert held(cache) == {"short": 0, "standard": 0, "long": 4}


def test_a_hit_that_promises_longer_moves_a_block_up(cache) -> None:
    """A short chain hit by a request of a day's retention is then long: it outlives a standard
    chain used after it under pressure."""
    cache.save(NS, chain(0), 0, *kv(2), ttl_s=300)
    cache.save(NS, chain(1), 0, *kv(2), ttl_s=3600)
    assert cache.flush(HANG_S)
    index = cache.parts.index
    index.match(NS, block_hashes(chain(0), NS), [86400, 86400])
    index.match(NS, block_hashes(chain(1), NS), [3600, 3600])  # the most recently used
    index.evict(index.total_bytes() // 2)
    assert len(index.match(NS, block_hashes(chain(0), NS), [1, 1]).entries) == 2
    assert len(index.match(NS, block_hashes(chain(1), NS), [1, 1]).entries) == 0


def test_classes_follow_the_promised_seconds() -> None:
    assert [retention_class(t) for t in (60, 300, 301, 3600, 3601, 86400)] == [0, 0, 1, 1, 2, 2]


def test_the_classes_are_counted_for_stats(cache) -> None:
    """``/stats``' ``blocks_by_retention``: blocks and tails (set back, still in their class) of
    each class, lowest first."""
    for name, seed in (("short", 0), ("standard", 1), ("standard", 2), ("long", 3)):
        cache.save(NS, chain(seed), 0, *kv(2), ttl_s=TTLS[name])
    assert cache.flush(HANG_S)
    shape = (SPEC.num_layers, SPEC.num_kv_heads, 40, SPEC.head_dim)
    cache.save_tail(NS, [*chain(3), *range(40)], torch.zeros(shape), torch.ones(shape), ttl_s=86400)
    cache.save_tail(NS, [*chain(0), *range(40)], torch.zeros(shape), torch.ones(shape), ttl_s=300)
    assert cache.flush(HANG_S)
    assert cache.parts.index.retention_counts() == [3, 4, 3, 0]


def test_pinned_blocks_outlive_any_budget_until_unpinned(cache) -> None:
    """A short chain pinned (a named cache's) survives an eviction to nothing that takes every
    long block, keeps its class when hit with a short TTL, and counts in ``pinned_bytes`` once
    however many pins hold it; unpinned, it goes first again."""
    for seed, name in ((0, "short"), (1, "long"), (2, "standard")):
        cache.save(NS, chain(seed), 0, *kv(2), ttl_s=TTLS[name])
    assert cache.flush(HANG_S)
    index, hashes = cache.parts.index, block_hashes(chain(0), NS)
    per_chain = index.total_bytes() // 3
    assert index.pins.pin(NS, hashes, 600) == (per_chain, per_chain, 0)
    assert index.pins.pin(NS, hashes, 600) == (0, per_chain, 0)  # a second named cache on the same blocks
    index.match(NS, hashes, [300, 300])
    assert index.retention_counts() == [0, 2, 2, 2]
    assert (index.pins.pinned_bytes(), index.evict(0) and index.total_bytes()) == (per_chain, per_chain)
    assert len(index.match(NS, hashes, [1, 1]).entries) == 2
    index.pins.unpin(NS, hashes)
    assert index.pins.pinned_bytes() == per_chain  # the other pin still holds
    index.pins.unpin(NS, hashes)
    assert index.pins.pinned_bytes() == 0 and index.retention_counts() == [0, 2, 0, 0]
    cache.save(NS, chain(1), 0, *kv(2), ttl_s=TTLS["long"])
    assert cache.flush(HANG_S)
    index.evict(per_chain)  # the chain kept its pin's 10 minutes: standard, below the long one
    assert len(index.match(NS, hashes, [1, 1]).entries) == 0


def test_a_chain_pinned_before_it_is_stored_is_pinned_as_it_is_published(cache) -> None:
    """A named cache pins its blocks before computing them: the byte budget never evicts them
    while they are stored."""
    index, hashes = cache.parts.index, block_hashes(chain(0), NS)
    assert index.pins.pin(NS, hashes, 600) == (0, 0, 2)
    cache.save(NS, chain(0), 0, *kv(2), ttl_s=300)
    assert cache.flush(HANG_S)
    per_chain = index.total_bytes()
    assert index.pins.pinned_bytes() == per_chain and index.retention_counts()[-1] == 2
    index.evict(0)
    assert len(index.match(NS, hashes, [1, 1]).entries) == 2


def test_a_pinned_block_forgotten_leaves_the_pinned_bytes(cache) -> None:
    """``kvproxy cache clear`` (FORGET in force) of a pinned chain takes its pinned bytes too."""
    cache.save(NS, chain(0), 0, *kv(2), ttl_s=300)
    assert cache.flush(HANG_S)
    index = cache.parts.index
    assert index.pins.pin(NS, block_hashes(chain(0), NS), 600)
    for members in list(index.members()):
        index.reclaim(members, force=True)
    assert (index.pins.pinned_bytes(), index.total_bytes()) == (0, 0)
