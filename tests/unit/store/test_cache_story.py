"""The prefix cache as one story, on the in-memory index double and a real blob directory: what
is stored, what a lookup serves and why it stops, how TTLs slide and expire, what the budget
evicts, what the collector reclaims. No Redis, no model."""

from __future__ import annotations

import errno
import threading

import pytest
import torch

from hashing import BLOCK_SIZE, block_hashes
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.entries import member_name
from store.index.memory.index import MemoryIndex
from store.outcomes import MissReason
from store.parts import CacheOptions
from tests.helpers import HANG_S, NS, SPEC, Clock, kv

IDS = list(range(3 * BLOCK_SIZE + 10))  # three full blocks and 10 tokens more
HASHES = block_hashes(IDS, NS)


class HangingBlobs(FileBlobStore):
    """A blob store whose reads of chosen blocks hang until ``release`` is set (a stuck mount)."""

    def __init__(self, root, hang: set[bytes]) -> None:
        super().__init__(root)
        self.hang, self.release, self.reading = hang, threading.Event(), threading.Event()

    def read(self, namespace, block_hash, max_bytes=None):
        if block_hash in self.hang:
            self.reading.set()
            self.release.wait(HANG_S)
        return super().read(namespace, block_hash, max_bytes)


class FailingBlobs(FileBlobStore):
    """A blob store whose reads of chosen blocks fail with an I/O error (a disk or a bucket that
    does not answer) until ``failing`` is emptied."""

    def __init__(self, root, failing: set[bytes]) -> None:
        super().__init__(root)
        self.failing = failing

    def read(self, namespace, block_hash, max_bytes=None):
        if block_hash in self.failing:
            raise OSError(errno.EIO, "input/output error")
        return super().read(namespace, block_hash, max_bytes)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def cache_on(index: MemoryIndex, blobs: FileBlobStore, **options) -> BlockCache:
    return BlockCache(index, blobs, SPEC, CacheOptions(ttl_s=600, **options))


@pytest.fixture
def cache(clock, tmp_path) -> BlockCache:
    return cache_on(MemoryIndex(clock), FileBlobStore(tmp_path))


def stored(cache: BlockCache, blocks: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    key, value = kv(blocks)
    cache.save(NS, IDS, 0, key, value)
    assert cache.flush(HANG_S)
    return key, value


def blocks_bytes(path, clock, count: int) -> int:
    """The bytes the blobs of ``stored``'s first ``count`` blocks take (compressed, they differ)."""
    probe = cache_on(MemoryIndex(clock), FileBlobStore(path))
    stored(probe)
    return sum(probe.parts.blobs.size(NS, h) or 0 for h in HASHES[:count])


def test_a_saved_chain_comes_back_verified_bit_for_bit(cache) -> None:
    """Save 3 blocks; a lookup of the same tokens serves exactly blocks 0, 1, 2 and their K/V."""
    key, value = stored(cache)
    match = cache.lookup(NS, IDS)
    assert [b.index for b in match.blocks] == [0, 1, 2] and match.miss_reason is None
    assert torch.equal(torch.stack([b.key for b in match.blocks]), key)
    assert torch.equal(torch.stack([b.value for b in match.blocks]), value)
    stats = cache.admin.stats()
    assert (stats.blocks_saved, stats.lookups, stats.tokens_queried, stats.tokens_hit) == (3, 1, 394, 384)


def test_a_prompt_that_diverges_in_block_1_stops_there_never_seen(cache) -> None:
    """Same block 0, other tokens after: one block served, reason "never seen"."""
    stored(cache)
    other = IDS[:BLOCK_SIZE] + [7] * (2 * BLOCK_SIZE)
    match = cache.lookup(NS, other)
    assert (match.num_blocks, match.miss_reason) == (1, MissReason.NEVER_SEEN)
    assert cache.lookup(NS, IDS, max_blocks=2).num_blocks == 2  # max_blocks caps the match


def test_ttl_slides_on_every_hit_then_expires(cache, clock) -> None:
    """TTL 600 s, refreshed by each hit: hits 500 s and 1,099 s in keep the chain; 601 s after the
    last hit it is gone ("expired or evicted")."""
    stored(cache)
    clock.advance(500)
    assert cache.lookup(NS, IDS).num_blocks == 3
    clock.advance(599)
    assert cache.lookup(NS, IDS).num_blocks == 3
    clock.advance(601)
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.miss_reason) == (0, MissReason.EXPIRED)


def test_a_corrupt_blob_ends_the_prefix_and_is_dropped(clock, tmp_path) -> None:
    """Block 1's blob truncated (RAM tier off): block 0 served, block 1's entry and blob gone, and
    block 2's entry (its K/V is computed again; its blob stays for the save to find)."""
    index, blobs = MemoryIndex(clock), FileBlobStore(tmp_path)
    cache = cache_on(index, blobs)
    stored(cache)
    blob = blobs.path(NS, HASHES[1])
    blob.write_bytes(blob.read_bytes()[:1000])
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.miss_reason) == (1, MissReason.FAILED_VERIFICATION)
    assert index.missing(NS, HASHES) == [False, True, True] and not blob.exists()
    assert blobs.exists(NS, HASHES[2])
    assert (
        cache.admin.stats().verification_failures == 1
        and cache.admin.stats().evictions["verification_failure"] == 1
    )


def test_the_ram_tier_serves_hot_blocks_without_their_blobs(clock, tmp_path) -> None:
    """With a RAM tier, blocks saved by this process are served even with their files deleted."""
    blobs = FileBlobStore(tmp_path)
    cache = cache_on(MemoryIndex(clock), blobs, ram_bytes=10 * SPEC.block_bytes)
    stored(cache)
    for h in HASHES:
        blobs.delete(NS, h)
    assert cache.lookup(NS, IDS).num_blocks == 3 and cache.admin.stats().blocks_from_ram == 3


def test_the_budget_evicts_the_tail_of_a_chain_first(clock, tmp_path) -> None:
    """A budget of blocks 0 and 1's bytes and three blocks saved: block 2 goes, 0 and 1 stay."""
    two_blocks = blocks_bytes(tmp_path / "probe", clock, 2)
    index, blobs = MemoryIndex(clock), FileBlobStore(tmp_path / "blobs")
    cache = cache_on(index, blobs, max_bytes=two_blocks)
    stored(cache)
    assert cache.admin.stats().evicted_budget == 1
    assert index.missing(NS, HASHES) == [False, False, True] and not blobs.exists(NS, HASHES[2])
    assert cache.admin.usage() == (2, two_blocks)


def test_a_block_evicted_by_the_budget_leaves_the_ram_tier_too(clock, tmp_path) -> None:
    """The RAM tier holds what the index holds: the block the budget evicted from the batch just
    saved is not kept in process memory."""
    two_blocks = blocks_bytes(tmp_path / "probe", clock, 2)
    cache = cache_on(
        MemoryIndex(clock), FileBlobStore(tmp_path / "blobs"), max_bytes=two_blocks, ram_bytes=1 << 30
    )
    stored(cache)
    assert len(cache.parts.ram) == 2 and cache.parts.ram.get(NS, HASHES[2]) is None


def test_the_collector_reclaims_expired_orphaned_and_unindexed_blocks(clock, tmp_path) -> None:
    """Block 0 expired (so 1 and 2 are orphans) and a stray file: all reclaimed, nothing left."""
    index, blobs = MemoryIndex(clock), FileBlobStore(tmp_path)
    cache = cache_on(index, blobs)
    stored(cache)
    index.tables.entries.pop(member_name(NS, HASHES[0]))  # as if its TTL ran out
    assert blobs.write(NS, b"\x01" * 16, b"not indexed")  # a file no entry accounts for
    found = cache.admin.gc(grace_s=0)
    assert (found.expired, found.orphans, found.unindexed_blobs) == (1, 2, 1)
    assert list(blobs.scan()) == [] and cache.admin.usage() == (0, 0)


def test_a_hanging_read_becomes_a_miss_after_the_bound(clock, tmp_path) -> None:
    """Block 1's read hangs: the lookup returns block 0 within its bound, reason "read timed out"."""
    blobs = HangingBlobs(tmp_path, {HASHES[1]})
    # NOTE: the bound must hold block 0's read however busy the machine; the test waits it out once
    cache = cache_on(MemoryIndex(clock), blobs, read_timeout_s=3.0)
    stored(cache)
    match = cache.lookup(NS, IDS)
    assert blobs.reading.is_set() and not blobs.release.is_set()  # still hanging
    assert (match.num_blocks, match.miss_reason) == (1, MissReason.TIMED_OUT)
    assert cache.admin.stats().read_timeouts == 1
    blobs.release.set()
    assert cache.lookup(NS, IDS).num_blocks == 3  # the mount recovered: a hit again


def test_a_failed_read_is_a_miss_that_keeps_the_blob(clock, tmp_path) -> None:
    """Block 1's read fails (EIO): the lookup serves block 0, reason "read failed", and neither the
    blob nor its index entry is dropped (a disk or a bucket's fault is not the blob's); once reads
    work again, all three blocks hit without being stored again."""
    blobs = FailingBlobs(tmp_path, {HASHES[1]})
    index = MemoryIndex(clock)
    cache = cache_on(index, blobs)
    stored(cache)
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.miss_reason) == (1, MissReason.READ_FAILED)
    assert cache.admin.stats().read_errors == 1 and cache.admin.stats().verification_failures == 0
    assert blobs.exists(NS, HASHES[1]) and member_name(NS, HASHES[1]) in index.tables.lru
    blobs.failing.clear()
    assert cache.lookup(NS, IDS).num_blocks == 3


def test_blocks_still_being_saved_are_served(cache) -> None:
    """The writer is held up: a lookup right after the save still serves all three blocks."""
    gate = threading.Event()
    assert cache.writer.enqueue(gate.wait)
    cache.save(NS, IDS, 0, *kv(3))
    match = cache.lookup(NS, IDS)
    gate.set()
    assert cache.flush(HANG_S)
    assert match.num_blocks == 3 and len(cache.writer.pending) == 0
    assert cache.lookup(NS, IDS).num_blocks == 3


def test_clear_removes_one_namespace_or_all(cache) -> None:
    stored(cache)
    assert cache.admin.clear("0" * 32) == 0 and cache.lookup(NS, IDS).num_blocks == 3
    assert cache.admin.clear(NS.hex()) == 3 and cache.lookup(NS, IDS).num_blocks == 0
