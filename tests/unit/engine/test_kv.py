"""engine/kv.py: blocks become a model's past with one copy, and a past becomes blocks again."""

from __future__ import annotations

import torch

from engine.buffers import BufferPool
from engine.kv import blocks_from_past, past_from_blocks
from hashing import BLOCK_SIZE, BlockHash, block_hashes, block_tokens
from store.interface import KVBlock
from tests.helpers import NS, SPEC, kv

IDS = list(range(3 * BLOCK_SIZE))


def blocks(n: int) -> list[KVBlock]:
    key, value = kv(n)
    hashes = block_hashes(IDS, NS)
    return [
        KVBlock(i, hashes[i], block_tokens(IDS, i), k, v)
        for i, (k, v) in enumerate(zip(key, value, strict=True))
    ]


def pool(keep: int = 2) -> BufferPool:
    like = torch.empty((SPEC.num_layers, SPEC.num_kv_heads, 0, SPEC.head_dim))
    return BufferPool(like, keep=keep, granule=BLOCK_SIZE)


def test_blocks_round_trip_through_a_past() -> None:
    """Three blocks -> a past of 383 positions (the n - 1 rule) -> blocks 0..1 are the same K/V."""
    given = blocks(3)
    past = past_from_blocks(given, 3 * BLOCK_SIZE - 1, pool().acquire(3 * BLOCK_SIZE))
    assert past.get_seq_length() == 383 and len(past.layers) == SPEC.num_layers
    key, value = blocks_from_past(past, 0, 2)
    assert (
        key.shape == (2, SPEC.num_layers, SPEC.num_kv_heads, BLOCK_SIZE, SPEC.head_dim)
        and key.is_contiguous()
    )
    assert torch.equal(key, torch.stack([b.key for b in given[:2]]))
    assert torch.equal(value, torch.stack([b.value for b in given[:2]]))


def test_a_past_grows_in_place_then_by_doubling() -> None:
    """Room for 128: 100 new positions go in place; 100 more double the buffer, keeping the rest."""
    past = past_from_blocks([], 0, pool().acquire(1))
    layer = past.layers[0]
    first = torch.randn(1, SPEC.num_kv_heads, 100, SPEC.head_dim)
    keys, _ = layer.update(first, first)
    assert keys.shape[2] == 100 and layer._key_buffer.shape[2] == BLOCK_SIZE
    more = torch.randn(1, SPEC.num_kv_heads, 100, SPEC.head_dim)
    keys, values = layer.update(more, more)
    assert keys.shape[2] == 200 and layer._key_buffer.shape[2] == 256
    assert torch.equal(keys, torch.cat([first, more], dim=2)) and torch.equal(values, keys)


def test_the_pool_reuses_the_smallest_buffer_that_fits() -> None:
    buffers = pool(keep=2)
    small, large = buffers.acquire(100), buffers.acquire(300)
    assert small[0].shape[3] == 128 and large[0].shape[3] == 384  # rounded up to the granule
    buffers.release(small)
    buffers.release(large)
    assert buffers.acquire(50)[0].data_ptr() == small[0].data_ptr()
    assert buffers.acquire(200)[0].data_ptr() == large[0].data_ptr()


def test_buffers_made_in_inference_mode_serve_outside_it() -> None:
    """A buffer the audit took (under inference mode) goes back to the pool; the lookup stage
    then writes a past into it outside inference mode, and a past grows there too."""
    like = torch.empty((2, 2, 0, 8))
    pool = BufferPool(like, keep=2, granule=16)
    with torch.inference_mode():
        taken = pool.acquire(128)
    pool.release(taken)
    key, value = torch.randn(2, 2, 128, 8), torch.randn(2, 2, 128, 8)
    past = past_from_blocks(
        [KVBlock(0, BlockHash(bytes(16)), tuple(range(128)), key, value)], 100, pool.acquire(32)
    )
    past.layers[0].update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
    assert past.get_seq_length() == 101
