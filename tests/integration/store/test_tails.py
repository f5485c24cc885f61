"""Tails in the store, on real Redis (its Lua scripts) and on the in-memory double alike: a tail
comes back verified, serves its longest common prefix with the prompt (all but its last token
to a repeat), is listed only while its entry lives, slides its TTL on a hit, goes before its
chain's blocks under the budget, and leaves with its entry however the entry goes (eviction, a
failed verification, clear). No model."""

from __future__ import annotations

import json
import time

import pytest
import torch

from hashing import BLOCK_SIZE, block_hashes, tail_hash
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.index.base import TAILS_PER_TIP
from store.index.memory.index import MemoryIndex
from store.index.redis.index import RedisIndex
from store.parts import CacheOptions
from tests.helpers import HANG_S, NS, SPEC, kv

IDS = list(range(2 * BLOCK_SIZE + 40))  # two full blocks, then a 40-token tail


def tail_kv(length: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (SPEC.num_layers, SPEC.num_kv_heads, length, SPEC.head_dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


@pytest.fixture(params=["memory", "redis"])
def make(request, redis_client, key_prefix, tmp_path):
    def build(**options) -> BlockCache:
        index = MemoryIndex() if request.param == "memory" else RedisIndex(redis_client, key_prefix)
        return BlockCache(index, FileBlobStore(tmp_path), SPEC, CacheOptions(ttl_s=600, **options))

    return build


def stored(cache: BlockCache, ids=IDS) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = len(ids) // BLOCK_SIZE
    if blocks:
        cache.save(NS, ids, 0, *kv(blocks))
    key, value = tail_kv(len(ids) % BLOCK_SIZE)
    cache.save_tail(NS, ids, key, value)
    assert cache.flush(HANG_S)
    return key, value


def test_a_tail_comes_back_verified_after_its_blocks(make) -> None:
    cache = make(ram_bytes=0)
    key, value = stored(cache)
    match = cache.lookup(NS, [*IDS, 1, 2, 3])
    assert (match.num_blocks, match.tail_tokens, match.num_tokens) == (2, 40, len(IDS))
    assert torch.equal(match.tail.key, key) and torch.equal(match.tail.value, value)
    stats = cache.admin.stats()
    assert (stats.tails_saved, stats.tails_hit, stats.tail_tokens_hit) == (1, 1, 40)


def test_a_repeated_prompt_is_served_all_but_its_last_token(make) -> None:
    cache = make()
    stored(cache)
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.tail_tokens) == (2, 39)


def test_a_prompt_that_leaves_the_tail_at_once_gets_no_tail(make) -> None:
    cache = make()
    stored(cache)
    other = IDS[: 2 * BLOCK_SIZE] + [999] * 40
    match = cache.lookup(NS, other)
    assert (match.num_blocks, match.tail) == (2, None)


def test_a_tail_serves_its_longest_common_prefix_with_the_prompt(make) -> None:
    """A 40-token tail after two blocks, the RAM tier off: a prompt that leaves it after k of its
    tokens (k = 1 .. 40) reuses the two blocks and exactly those k tokens, read from its blob and
    verified (the K/V of its first k tokens depends on them alone)."""
    cache = make(ram_bytes=0)
    key, value = stored(cache)
    for k in range(1, 41):
        prompt = [*IDS[: 2 * BLOCK_SIZE + k], 999, 998, *IDS[2 * BLOCK_SIZE + k :]]
        match = cache.lookup(NS, prompt)
        assert (match.num_blocks, match.tail_tokens, match.num_tokens) == (2, k, 2 * BLOCK_SIZE + k), k
        assert torch.equal(match.tail.key[:, :, :k], key[:, :, :k]), k
        assert torch.equal(match.tail.value[:, :, :k], value[:, :, :k]), k
    stats = cache.admin.stats()
    assert (stats.tails_hit, stats.tail_tokens_hit, stats.verification_failures) == (40, 40 * 41 // 2, 0)


def test_the_tail_sharing_most_with_the_prompt_serves_it(make) -> None:
    """Three tails after one tip, sharing 5, 30 and 12 tokens with the prompt: the 30 serve it."""
    cache = make(ram_bytes=0)
    base = IDS[: 2 * BLOCK_SIZE]
    for shared in (5, 30, 12):
        stored(cache, [*IDS[: 2 * BLOCK_SIZE + shared], *[500 + shared] * 20])
    match = cache.lookup(NS, [*base, *IDS[2 * BLOCK_SIZE :], 7])
    assert (match.num_blocks, match.tail_tokens) == (2, 30)
    assert match.tail.token_ids == (*IDS[2 * BLOCK_SIZE : 2 * BLOCK_SIZE + 30], *[530] * 20)


def test_a_tail_listed_without_its_ids_is_served_by_its_names(make, redis_client) -> None:
    """A listing without token ids (written before they were listed) or with ids that are not its
    tail's: all or all but the last token are served as before, nothing more, nothing dropped."""
    for ids in (None, tuple(range(40))):
        cache = make(ram_bytes=0)
        cache.admin.clear()
        stored(cache)
        tip = block_hashes(IDS, NS)[-1]
        relist(cache, redis_client, tip, ids)
        leaves = [*IDS[: 2 * BLOCK_SIZE + 10], 999, *IDS[2 * BLOCK_SIZE + 10 :]]
        assert cache.lookup(NS, leaves).tail is None
        assert cache.lookup(NS, IDS).tail_tokens == 39
        assert cache.lookup(NS, [*IDS, 5]).tail_tokens == 40
        assert cache.admin.stats().verification_failures == 0


def relist(cache: BlockCache, redis_client, tip, ids: tuple[int, ...] | None) -> None:
    """Rewrite the listings after ``tip`` with ``ids`` as every tail's token ids (None: none)."""
    index = cache.parts.index
    if isinstance(index, MemoryIndex):
        listed = index.tables.tails[(NS, tip)]
        for name, (listing, expires) in listed.items():
            listed[name] = (listing._replace(token_ids=ids), expires)
        return
    key, field = index.keys.of(NS.hex(), "tails"), tip.hex()
    items = json.loads(redis_client.hget(key, field))
    text = ",".join(map(str, ids)) if ids is not None else None
    redis_client.hset(key, field, json.dumps([[*item[:4], text] if text else item[:4] for item in items]))


def test_a_tail_at_the_root_serves_a_prompt_under_one_block(make) -> None:
    cache = make()
    stored(cache, IDS[:50])
    assert cache.lookup(NS, IDS[:50]).tail_tokens == 49
    assert cache.lookup(NS, IDS[:80]).tail_tokens == 50


def test_the_budget_evicts_tails_before_any_block_and_unlists_them(make) -> None:
    """The tail was stored after its blocks, and another chain's blocks after it: still the tail
    goes first."""
    cache = make()
    stored(cache)
    cache.save(NS, [5] * BLOCK_SIZE, 0, *kv(1))
    assert cache.flush(HANG_S)
    index = cache.parts.index
    index.evict(index.total_bytes() - 1)
    assert index.num_blocks() == 3  # the tail went first, the blocks stay
    cache.parts.ram.clear()
    match = cache.lookup(NS, [*IDS, 1])
    assert (match.num_blocks, match.tail) == (2, None)
    assert index.match(NS, block_hashes(IDS, NS), [600, 600]).tails == []


def test_a_bad_tail_is_dropped_and_unlisted(make, tmp_path) -> None:
    cache = make(ram_bytes=0)
    stored(cache)
    tip = cache.lookup(NS, IDS[: 2 * BLOCK_SIZE]).blocks[-1].block_hash
    name = tail_hash(tip, IDS[2 * BLOCK_SIZE :])
    path = cache.parts.blobs.path(NS, name)
    path.write_bytes(path.read_bytes()[:-8] + b"\0" * 8)
    match = cache.lookup(NS, [*IDS, 1])
    assert (match.num_blocks, match.tail) == (2, None)
    assert cache.parts.index.missing(NS, [name]) == [True]
    assert cache.admin.stats().verification_failures == 1


def test_clear_removes_tails_with_their_listing(make) -> None:
    cache = make()
    stored(cache)
    assert cache.admin.clear() == 3
    assert cache.lookup(NS, [*IDS, 1]).num_tokens == 0


def test_at_most_a_bounded_number_of_tails_are_listed_after_one_tip(make) -> None:
    cache = make()
    for i in range(TAILS_PER_TIP + 4):
        stored(cache, [1000 + i] * 5)
    tails = cache.parts.index.match(NS, [], []).tails
    assert len(tails) == TAILS_PER_TIP


def test_a_hit_slides_the_tail_ttl(make) -> None:
    """TTL 5 s: hits every 1.8 s keep a tail for 5.4 s (longer than its TTL); 5 s more without
    one, it is gone. NOTE: each hit must come within the TTL of the one before: 1.8 s apart leaves
    a hit 3.2 s, however slow the machine; waiting longer for the expiry changes nothing."""
    cache = make()
    key, value = tail_kv(30)
    cache.save_tail(NS, IDS[:30], key, value, ttl_s=5)
    assert cache.flush(HANG_S)
    for _ in range(3):
        time.sleep(1.8)
        assert cache.lookup(NS, IDS[:31], ttl_s=5).tail_tokens == 30
        assert cache.flush(HANG_S)  # the touch runs in the background
    time.sleep(5.2)
    cache.parts.ram.clear()
    assert cache.lookup(NS, IDS[:31]).tail is None


def test_the_collector_prunes_expired_listings_no_lookup_reads(make) -> None:
    """A tail expires; its listing goes with the collector's pass, though no lookup reads its tip."""
    cache = make()
    key, value = tail_kv(30)
    cache.save_tail(NS, IDS[:30], key, value, ttl_s=1)
    assert cache.flush(HANG_S)
    time.sleep(1.2)
    index = cache.parts.index
    cache.admin.gc(grace_s=0)
    if isinstance(index, RedisIndex):
        assert not index.client.exists(index.keys.of(NS.hex(), "tails"))
    else:
        assert index.tables.tails == {}
    assert index.num_blocks() == 0


def test_a_tail_beyond_the_listing_is_still_found_by_its_own_tokens(make) -> None:
    """More tails after one tip than are listed (short prompts all follow the root; many
    questions follow one shared block): every one still serves its own prompt again, to the
    token, since a prompt whose blocks are all cached names its candidate tails itself."""
    cache = make()
    short = [[2000 + i, 7, 8, 9] for i in range(TAILS_PER_TIP + 8)]
    shared = IDS[: BLOCK_SIZE + 72]
    long = [shared + [3000 + i] * 20 for i in range(TAILS_PER_TIP + 8)]
    for ids in short + long:
        stored(cache, ids)
    assert [cache.lookup(NS, ids).tail_tokens for ids in short] == [3] * len(short)
    assert [cache.lookup(NS, ids).num_tokens for ids in long] == [len(long[0]) - 1] * len(long)
