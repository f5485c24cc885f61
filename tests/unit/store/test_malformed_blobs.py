"""A blob or tail that cannot be decoded, however it is malformed (``tests.blob_damage``), is a
verification failure: the lookup serves the prefix before it, the file and its index entry are
dropped and counted, and the next save stores it again and is served. The in-memory index double,
real files, no model."""

from __future__ import annotations

import pytest
import torch

from hashing import BLOCK_SIZE, block_hashes, tail_hash
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.index.memory.index import MemoryIndex
from store.interface import KVBlock
from store.outcomes import MissReason
from store.parts import CacheOptions
from store.serde import encode_block
from tests.blob_damage import MALFORMED
from tests.helpers import HANG_S, NS, SPEC, kv

IDS = list(range(2 * BLOCK_SIZE + 40))  # two full blocks, then a 40-token tail
HASHES = block_hashes(IDS, NS)
TAIL = tail_hash(HASHES[1], IDS[2 * BLOCK_SIZE :])


def tail_kv() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    shape = (SPEC.num_layers, SPEC.num_kv_heads, 40, SPEC.head_dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


@pytest.fixture
def cache(tmp_path) -> BlockCache:
    return BlockCache(MemoryIndex(), FileBlobStore(tmp_path), SPEC, CacheOptions(ttl_s=600, ram_bytes=0))


def store_all(cache: BlockCache) -> None:
    """The two blocks and the tail of ``IDS``, on disk and indexed."""
    cache.save(NS, IDS, 0, *kv(2))
    cache.save_tail(NS, IDS, *tail_kv())
    assert cache.flush(HANG_S)


def damage(cache: BlockCache, name: bytes, how) -> None:
    path = cache.parts.blobs.path(NS, name)
    path.write_bytes(how(path.read_bytes()))


@pytest.mark.parametrize("malformed", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_block_is_a_miss_from_there_and_is_stored_again(cache, malformed) -> None:
    """Block 1 malformed: block 0 only is served (failed verification), block 1's file and entry
    are gone, one failure counted; saved again, both blocks and the tail are served."""
    store_all(cache)
    damage(cache, HASHES[1], MALFORMED[malformed])
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.tail, match.miss_reason) == (1, None, MissReason.FAILED_VERIFICATION)
    assert not cache.parts.blobs.path(NS, HASHES[1]).exists()
    assert cache.parts.index.missing(NS, [HASHES[1]]) == [True]
    assert cache.admin.stats().verification_failures == 1
    store_all(cache)
    again = cache.lookup(NS, IDS)
    assert (again.num_blocks, again.tail_tokens, again.miss_reason) == (2, 39, None)
    assert cache.admin.stats().verification_failures == 1


def beyond_32_bits(data: bytes) -> bytes:
    """The tail re-encoded, checksum and all, with its last token id 2**40: no uint32 holds it, so
    naming the tail by its tokens (``hashing.tail_hash``) raises ``struct.error``."""
    key, value = tail_kv()
    block = KVBlock(2, TAIL, (*IDS[2 * BLOCK_SIZE : -1], 2**40), key, value)
    return encode_block(block, NS, HASHES[1], SPEC)


TAIL_DAMAGE = MALFORMED | {"token-id-beyond-32-bits": beyond_32_bits}


@pytest.mark.parametrize("malformed", TAIL_DAMAGE, ids=list(TAIL_DAMAGE))
def test_a_malformed_tail_is_dropped_and_stored_again(cache, malformed) -> None:
    """The tail malformed: both blocks are served without it, its file and listing are gone, one
    failure counted; saved again, it is served."""
    store_all(cache)
    damage(cache, TAIL, TAIL_DAMAGE[malformed])
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.tail) == (2, None)
    assert not cache.parts.blobs.path(NS, TAIL).exists()
    assert cache.parts.index.missing(NS, [TAIL]) == [True]
    assert cache.admin.stats().verification_failures == 1
    store_all(cache)
    assert cache.lookup(NS, IDS).tail_tokens == 39
