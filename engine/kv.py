"""KV layout: cut a model's cache into blocks, and build a model's cache from blocks.

Blocks are ``[num_layers, num_kv_heads, 128, head_dim]``; the model's cache (transformers'
``DynamicCache``) holds per layer ``[batch=1, num_kv_heads, seq_len, head_dim]``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from hashing import BLOCK_SIZE
from store.interface import KVBlock


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose K/V live in a preallocated buffer with room to grow.

    transformers' ``DynamicLayer`` concatenates the whole past with every new token (a copy of
    all of it per forward); this one writes new K/V in place, and ``keys``/``values`` are views
    ``[batch, num_kv_heads, length, head_dim]`` of the buffer ``[.., capacity, ..]``. When the
    buffer is full it is doubled (one copy).
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int) -> None:
        super().__init__()
        self.lazy_initialization(key_buffer, value_buffer)
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self._set_length(length)

    def _set_length(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.length = length
        keys, values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]
        self.keys, self.values = keys, values
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *_args: object, **_kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` ``[batch, num_kv_heads, new, head_dim]``;
        returns the K/V of every position so far."""
        end = self.length + key_states.shape[-2]
        self.reserve(end)
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        return self._set_length(end)

    def get_seq_length(self) -> int:
        return self.length

    @property
    def capacity(self) -> int:
        """Positions the buffer holds before it must grow."""
        return int(self._key_buffer.shape[-2])

    def reserve(self, positions: int) -> None:
        """Make room for ``positions`` positions (doubling the buffer, one copy, when short)."""
        if positions > self.capacity:
            capacity = max(positions, 2 * self.capacity)
            self._key_buffer = _grown(self._key_buffer, self.length, capacity)
            self._value_buffer = _grown(self._value_buffer, self.length, capacity)
            self._set_length(self.length)

    def buffer_pointers(self) -> tuple[int, int]:
        """Addresses of the K and V buffers ``[1, num_kv_heads, capacity, head_dim]`` (contiguous),
        where a native step writes new positions in place (then ``grow_to``)."""
        assert self._key_buffer.is_contiguous() and self._value_buffer.is_contiguous()
        return int(self._key_buffer.data_ptr()), int(self._value_buffer.data_ptr())

    def grow_to(self, length: int) -> None:
        """Positions ``[self.length, length)`` were written in place: they are part of the past now."""
        assert length <= self.capacity, (length, self.capacity)
        self._set_length(length)


def _grown(buffer: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    batch, heads, _, dim = buffer.shape
    with torch.inference_mode(False):
        grown = buffer.new_empty((batch, heads, capacity, dim))
    grown[:, :, :length] = buffer[:, :, :length]
    return grown


class BufferPool:
    """K/V buffers ``[num_layers, 1, num_kv_heads, capacity, head_dim]`` reused between requests.

    A fresh buffer costs a page fault per 4 KiB on first touch: for a 2,048-token past of the
    default model that is about 40 ms, five times the copy of the cached blocks into it. Capacities
    are rounded up to ``granule`` tokens so buffers fit later requests of similar length.

    Args:
        like: a tensor ``[num_layers, num_kv_heads, any, head_dim]`` giving shape, dtype, device.
        keep: most free buffer pairs kept (older ones are released to the allocator).
        granule: capacity rounding, in tokens.
    """

    def __init__(self, like: torch.Tensor, keep: int, granule: int = 1024) -> None:
        self.like = like
        self.keep = keep
        self.granule = granule
        self._free: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._lock = threading.Lock()

    def acquire(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A (key, value) buffer pair with room for at least ``capacity`` tokens."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b[0].shape[3] >= capacity]
            if fits:
                return self._free.pop(min(fits, key=lambda i: self._free[i][0].shape[3]))
        layers, heads, _, dim = self.like.shape
        size = (layers, 1, heads, -(-max(capacity, 1) // self.granule) * self.granule, dim)
        # NOTE: never inference tensors (as made under the audit's inference mode): a buffer goes
        # back to the pool, and the lookup stage then writes into it outside inference mode
        with torch.inference_mode(False):
            return self.like.new_empty(size), self.like.new_empty(size)

    def release(self, buffers: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Give a pair back; nothing may use it afterwards."""
        with self._lock:
            self._free.append(buffers)
            if len(self._free) > self.keep:
                del self._free[: len(self._free) - self.keep]


def past_from_blocks(
    blocks: Sequence[KVBlock],
    num_tokens: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
    kernels: ctypes.CDLL | None = None,
) -> DynamicCache:
    """A cache holding the K/V of the first ``num_tokens`` tokens of ``blocks``, in ``buffers``.

    Every block's K/V is copied once, straight into its place in the buffers; the cache grows in
    place until the buffers' capacity and is copied to larger buffers beyond it.

    Args:
        blocks: leading blocks of a prompt, in chain order.
        num_tokens: at most ``128 * len(blocks)``; fewer when the last block is used only in
            part (a fully cached prompt reuses 127 tokens of its last block).
        buffers: key and value ``[num_layers, 1, num_kv_heads, capacity, head_dim]``, e.g. from
            ``BufferPool.acquire``; their contents are overwritten.
        kernels: the native library (``engine.kernels.build``): on the CPU, for float32, its
            ``kvp_gather`` copies everything in one call (thousands of torch copies otherwise).

    Returns:
        A ``DynamicCache`` of ``GrowingLayer``s holding ``num_tokens`` positions.
    """
    assert 0 <= num_tokens <= BLOCK_SIZE * len(blocks), (num_tokens, len(blocks))
    key, value = buffers
    assert key.shape[3] >= num_tokens, (key.shape, num_tokens)
    # NOTE: on the CPU, one head of one layer at a time: each copy stays below PyTorch's parallel
    # grain, so this thread (the lookup stage) never starts an OpenMP team of its own. More teams
    # than cores make every team's threads sleep between operations, which slows the model
    # thread's decode steps by a third. To an accelerator, from pinned memory, the copies are
    # asynchronous, ahead of the model on the same stream.
    if kernels is not None and key.device.type == "cpu" and key.dtype == torch.float32 and blocks:
        _gather(kernels, blocks, num_tokens, buffers)
        return _past(buffers, num_tokens)
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
    return _past(buffers, num_tokens)


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


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in host memory: itself when it is there; from an accelerator, a copy into
    pinned (page-locked) memory, which transfers at full speed, waited for before returning."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensor.device).synchronize()
    return host
