"""K/V buffers: ``GrowingLayer``, a layer of the model's cache written in place in a preallocated
buffer, and ``BufferPool``, such buffers reused between requests."""

from __future__ import annotations

import threading

import torch
from transformers.cache_utils import DynamicLayer


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
