"""Hot prefixes on the in-memory index (``--redis-url memory://``), with a clock the test turns:
ranked by tokens saved, TTL left from the last block, expired ones forgotten, at most ``HOT_KEEP``."""

from __future__ import annotations

from hashing import BLOCK_SIZE, block_hashes
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.entries import member_name
from store.index.memory import hot as memory_hot
from store.index.memory.index import MemoryIndex
from store.parts import CacheOptions
from tests.helpers import HANG_S, NS, SPEC, Clock, kv

IDS = list(range(3 * BLOCK_SIZE + 10))


def test_hot_prefixes_in_memory(tmp_path) -> None:
    """Hits rank the prefixes; the TTL counts down on the clock; an expired prefix goes."""
    clock = Clock()
    index = MemoryIndex(clock)
    cache = BlockCache(index, FileBlobStore(tmp_path), SPEC, CacheOptions(ttl_s=600))
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    cache.lookup(NS, IDS[: BLOCK_SIZE + 1])
    for _ in range(3):
        cache.lookup(NS, IDS)
    assert cache.flush(HANG_S)
    clock.advance(100)
    rows = cache.admin.hot_prefixes(NS, readable=NS)
    assert [(r.hits, r.tokens_saved, r.blocks, r.ttl_seconds) for r in rows] == [
        (3, 3 * 384, 3, 500),
        (1, 128, 1, 500),
    ]
    assert rows[0].token_ids == IDS[:BLOCK_SIZE]
    last = index.entries([member_name(NS, block_hashes(IDS, NS)[2])])[0]
    assert last is not None and rows[0].bytes == 3 * last.size
    clock.advance(501)
    assert cache.admin.hot_prefixes(NS) == []


def test_at_most_keep_prefixes_per_namespace(tmp_path, monkeypatch) -> None:
    """Past ``HOT_KEEP`` prefixes, the one that saved the fewest tokens is dropped."""
    monkeypatch.setattr(memory_hot, "HOT_KEEP", 2)
    cache = BlockCache(MemoryIndex(), FileBlobStore(tmp_path), SPEC, CacheOptions(ttl_s=600))
    cache.save(NS, IDS, 0, *kv(3))
    assert cache.flush(HANG_S)
    for blocks in (1, 2, 3):
        cache.lookup(NS, IDS[: blocks * BLOCK_SIZE + 1])
    assert cache.flush(HANG_S)
    assert [r.tokens_saved for r in cache.admin.hot_prefixes(NS)] == [384, 256]
