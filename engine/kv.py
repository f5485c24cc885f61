"""KV layout: cut a model's cache into blocks and tails, and build a model's cache from them.

Blocks are ``[num_layers, num_kv_heads, 128, head_dim]`` (a tail's ``[.., L, ..]``); the model's
cache (transformers' ``DynamicCache``) holds per layer ``[batch=1, num_kv_heads, seq_len,
head_dim]``, in the preallocated buffers of ``engine.buffers``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.buffers import GrowingLayer
from hashing import BLOCK_SIZE
from store.interface import KVBlock


def past_from_blocks(
    blocks: Sequence[KVBlock],
    num_tokens: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
    kernels: ctypes.CDLL | None = None,
    tail: KVBlock | None = None,
    tail_tokens: int = 0,
) -> DynamicCache:
    """A cache holding the K/V of the first ``num_tokens`` tokens of ``blocks``, then the first
    ``tail_tokens`` of ``tail`` (``[num_layers, num_kv_heads, L, head_dim]``), in ``buffers``.

    Every block's K/V is copied once, straight into its place in the buffers; the cache grows in
    place until the buffers' capacity and is copied to larger buffers beyond it.

    Args:
        blocks: leading blocks of a prompt, in chain order.
        num_tokens: at most ``128 * len(blocks)``; fewer when the last block is used only in
            part (a fully cached prompt reuses 127 tokens of its last block).
        buffers: key and value ``[num_layers, 1, num_kv_heads, capacity, head_dim]``, e.g. from
            ``BufferPool.acquire``; their contents are overwritten.
        kernels: the native library (``engine.kernels.build``): on the CPU, for float32, its
            ``kvp_gather`` copies the blocks in one call (thousands of torch copies otherwise).
        tail, tail_tokens: a tail after all of ``blocks`` (``num_tokens`` is then
            ``128 * len(blocks)``), and how many of its tokens to take.

    Returns:
        A ``DynamicCache`` of ``GrowingLayer``s holding ``num_tokens + tail_tokens`` positions.
    """
    assert 0 <= num_tokens <= BLOCK_SIZE * len(blocks), (num_tokens, len(blocks))
    assert tail is None or num_tokens == BLOCK_SIZE * len(blocks), (num_tokens, len(blocks))
    key, value = buffers
    assert key.shape[3] >= num_tokens + tail_tokens, (key.shape, num_tokens, tail_tokens)
    if tail is not None and tail_tokens:
        span = slice(num_tokens, num_tokens + tail_tokens)
        # NOTE: one layer at a time, below PyTorch's parallel grain (see below)
        for layer in range(key.shape[0]):
            key[layer, 0, :, span].copy_(tail.key[layer, :, :tail_tokens], non_blocking=True)
            value[layer, 0, :, span].copy_(tail.value[layer, :, :tail_tokens], non_blocking=True)
    return _blocks_past(blocks, num_tokens, buffers, kernels, num_tokens + tail_tokens)


def _blocks_past(
    blocks: Sequence[KVBlock],
    num_tokens: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
    kernels: ctypes.CDLL | None,
    length: int,
) -> DynamicCache:
    """``past_from_blocks`` of the blocks alone, the past then ``length`` positions long."""
    key, value = buffers
    # NOTE: on the CPU, one head of one layer at a time: each copy stays below PyTorch's parallel
    # grain, so this thread (the lookup stage) never starts an OpenMP team of its own. More teams
    # than cores make every team's threads sleep between operations, which slows the model
    # thread's decode steps by a third. To an accelerator, from pinned memory, the copies are
    # asynchronous, ahead of the model on the same stream.
    if kernels is not None and key.device.type == "cpu" and key.dtype == torch.float32 and blocks:
        _gather(kernels, blocks, num_tokens, buffers)
        return _past(buffers, length)
    pieces: list[tuple[int | slice, int | slice]] = [(slice(None), slice(None))]
    if key.device.type == "cpu":
        pieces = [(layer, head) for layer in range(key.shape[0]) for head in range(key.shape[2])]
    for i, block in enumerate(blocks):
        span = slice(i * BLOCK_SIZE, min((i + 1) * BLOCK_SIZE, num_tokens))
        if span.start >= span.stop:
            break
        n = span.stop - span.start
        for layer, head in pieces:
            key[layer, 0, head, span].copy_(block.key[layer, head, :n], non_blocking=True)
            value[layer, 0, head, span].copy_(block.value[layer, head, :n], non_blocking=True)
    return _past(buffers, length)


def _past(buffers: tuple[torch.Tensor, torch.Tensor], num_tokens: int) -> DynamicCache:
    key, value = buffers
    past = DynamicCache()
    past.layers = [GrowingLayer(key[i], value[i], num_tokens) for i in range(key.shape[0])]
    return past


def _gather(
    kernels: ctypes.CDLL,
    blocks: Sequence[KVBlock],
    num_tokens: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
) -> None:
    layers, _, heads, capacity, dim = buffers[0].shape
    for target, part in zip(buffers, ("key", "value"), strict=True):
        tensors = [getattr(b, part) for b in blocks]
        assert target.is_contiguous() and all(t.is_contiguous() and t.dtype == torch.float32 for t in tensors)
        pointers = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
        kernels.kvp_gather(
            ctypes.c_void_p(target.data_ptr()),
            ctypes.c_int64(layers),
            ctypes.c_int64(heads),
            ctypes.c_int64(capacity),
            ctypes.c_int64(dim),
            pointers,
            ctypes.c_int32(len(tensors)),
            ctypes.c_int64(num_tokens),
        )


def blocks_from_past(
    past: DynamicCache, first_block: int, end_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the K/V of blocks ``[first_block, end_block)`` out of a cache.

    Returns:
        ``(key, value)``, each ``[m, num_layers, num_kv_heads, 128, head_dim]`` for the
        ``m = end_block - first_block`` blocks: fresh contiguous tensors in host memory, safe to
        hand to a background writer (from an accelerator, copied through pinned memory).
    """
    span = slice(first_block * BLOCK_SIZE, end_block * BLOCK_SIZE)
    assert past.get_seq_length() >= span.stop, (past.get_seq_length(), span)
    layers = [cast(DynamicLayer, layer) for layer in past.layers]

    def blocks(tensors: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack([t[0, :, span] for t in tensors])  # [layers, heads, 128 m, dim]
        layers_, heads, _, dim = stacked.shape
        per_block = stacked.view(layers_, heads, -1, BLOCK_SIZE, dim).permute(2, 0, 1, 3, 4)
        return host_copy(per_block.contiguous())

    return blocks([cast(torch.Tensor, layer.keys) for layer in layers]), blocks(
        [cast(torch.Tensor, layer.values) for layer in layers]
    )


def tail_from_past(past: DynamicCache, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the K/V of positions ``[start, end)`` (a tail: ``start`` a multiple of 128, fewer
    than 128 positions) out of a cache.

    Returns:
        ``(key, value)``, each ``[num_layers, num_kv_heads, end - start, head_dim]``, fresh and
        contiguous in host memory.
    """
    assert start % BLOCK_SIZE == 0 and 0 < end - start < BLOCK_SIZE, (start, end)
    assert past.get_seq_length() >= end, (past.get_seq_length(), end)
    layers = [cast(DynamicLayer, layer) for layer in past.layers]

    def copy(tensors: list[torch.Tensor]) -> torch.Tensor:
        return host_copy(torch.stack([t[0, :, start:end] for t in tensors]).contiguous())

    return copy([cast(torch.Tensor, layer.keys) for layer in layers]), copy(
        [cast(torch.Tensor, layer.values) for layer in layers]
    )


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in host memory: itself when it is there; from an accelerator, a copy into
    pinned (page-locked) memory, which transfers at full speed, waited for before returning."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensor.device).synchronize()
    return host
