"""Block formats: how a block's K/V is held at rest, exactly or in fewer bytes.

Every format stores named arrays (``encode``), each compressed losslessly with Blosc2 (the zstd
codec at level 1 after its byte shuffle, which groups the i-th byte of every value so a float's
sign and exponent bytes compress together: 1.19x on float32 K/V of the default model, unpacking
at 2-3.6 GB/s on two cores alone (about 1 GB/s inside a busy server, docs/benchmarks.md); lz4
gave 1.06x, zstd without the shuffle 1.09x). What the arrays hold is the block format, part of the namespace
(``hashing.NamespaceIdentity.block_format``), so a lossy block is never served to an exact one:

- ``exact``: the K/V's own bytes; every bit comes back.
- ``bfloat16``: K and V rounded to bfloat16 (to nearest even): half the bytes of float32.
- ``int8``: KIVI's layout (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for
  KV Cache"), at 8 bits: K quantized per channel (one scale and zero point per layer, head and
  channel over the block's tokens), V per token (one per layer, head and token), asymmetric
  (``x ~ zero + scale * q``, ``q`` in 0..255): about a quarter of float32's bytes.

``encode`` gives the arrays to store, ``decode`` the K/V they stand for (in the model's dtype),
``round_trip`` the K/V a stored block will be served as (what a hit on it computes on).
"""

from __future__ import annotations

import dataclasses
import os

import blosc2
import numpy as np
import torch

from store.block_format import BlockFormat
from store.interface import KVBlock, KVSpec

CODEC = "blosc2-zstd1-shuffle"
"""The lossless codec of every stored array (a blob's ``codec`` metadata)."""
READ_THREADS = min(4, os.cpu_count() or 1)
"""Blosc2 threads decompressing one array (the lookup's thread waits on it)."""


class CodecError(ValueError):
    """Stored arrays that do not decode to the block they claim; the message says why."""


def encode(key: torch.Tensor, value: torch.Tensor, block_format: BlockFormat) -> dict[str, torch.Tensor]:
    """The arrays (in ``shapes``'s order) storing ``key`` and ``value`` (``[num_layers,
    num_kv_heads, tokens, head_dim]``, on the CPU) in ``block_format``, unpacked (``compress``
    packs each)."""
    if block_format == "exact":
        return {"key": key.contiguous(), "value": value.contiguous()}
    if block_format == "bfloat16":
        return {"key": key.to(torch.bfloat16).contiguous(), "value": value.to(torch.bfloat16).contiguous()}
    if block_format == "int8":
        # NOTE: KIVI: K's outliers sit in fixed channels, V's error is best bounded per token
        return _quantize("key", key, dim=2) | _quantize("value", value, dim=3)
    raise CodecError(f"unknown block format {block_format!r}")


def decode(
    arrays: dict[str, torch.Tensor], block_format: BlockFormat, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """``(key, value)`` in ``dtype`` from the arrays ``encode`` gave for ``block_format``."""
    if block_format == "int8":
        # NOTE: in place, one pass after the conversion (``zero + scale * q``, float32 math)
        return tuple(
            arrays[name]
            .to(torch.float32)
            .mul_(arrays[f"{name}_scale"])
            .add_(arrays[f"{name}_zero"])
            .to(dtype)
            for name in ("key", "value")
        )
    return tuple(arrays[name].to(dtype) for name in ("key", "value"))


def round_trip(key: torch.Tensor, value: torch.Tensor, block_format: BlockFormat) -> tuple[torch.Tensor, ...]:
    """``(key, value)`` as a block stored in ``block_format`` decodes (themselves when exact)."""
    if block_format == "exact":
        return key, value
    return decode(encode(key, value, block_format), block_format, key.dtype)


def served(block: KVBlock, spec: KVSpec) -> KVBlock:
    """``block`` as a hit on its blob in ``spec.block_format`` serves it (itself when exact).

    NOTE: until its blob is written, the writer's pending blocks serve a lossy block as computed.
    """
    if spec.block_format == "exact":
        return block
    key, value = round_trip(block.key, block.value, spec.block_format)
    return dataclasses.replace(block, key=key, value=value)


def shapes(
    block_format: BlockFormat, layers: int, heads: int, tokens: int, dim: int, dtype: torch.dtype
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each array a block of ``block_format`` stores, in the order ``encode``
    gives them (the order a blob's checksum covers them in)."""
    kv = (layers, heads, tokens, dim)
    if block_format == "int8":
        k, v = (layers, heads, 1, dim), (layers, heads, tokens, 1)
        f32 = torch.float32
        return {
            "key": (kv, torch.uint8),
            "key_scale": (k, f32),
            "key_zero": (k, f32),
            "value": (kv, torch.uint8),
            "value_scale": (v, f32),
            "value_zero": (v, f32),
        }
    stored = torch.bfloat16 if block_format == "bfloat16" else dtype
    return {"key": (kv, stored), "value": (kv, stored)}


def compress(array: torch.Tensor) -> bytes:
    """``array``'s bytes packed by ``CODEC`` (one thread: the writer's, in the background)."""
    data = array.contiguous().view(torch.uint8).numpy()
    shuffled = {"filters": [blosc2.Filter.SHUFFLE], "typesize": array.element_size()}
    packed: bytes = blosc2.compress2(data, codec=blosc2.Codec.ZSTD, clevel=1, nthreads=1, **shuffled)
    return packed


def decompress(packed: memoryview, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The array of ``shape`` and ``dtype`` that ``compress`` packed into ``packed``.

    Raises:
        CodecError: not a packed array of exactly that many bytes.
    """
    out = torch.empty(shape, dtype=dtype)
    expected = out.numel() * out.element_size()
    try:
        size, _, _ = blosc2.get_cbuffer_sizes(packed)
        if size != expected:
            raise CodecError(f"a packed array of {size} bytes, expected {expected} (corrupt file)")
        blosc2.decompress2(packed, dst=out.view(torch.uint8).numpy(), nthreads=READ_THREADS)
    except CodecError:
        raise
    except Exception as exc:  # NOTE: Blosc2 raises RuntimeError or ValueError on bad data
        raise CodecError(f"packed bytes do not unpack (corrupt file): {exc}") from exc
    return out


def _quantize(name: str, x: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    """8-bit asymmetric codes of ``x`` (float32 math) with one scale and zero point per slice
    along ``dim`` (reduced over it): ``{name: uint8, name_scale, name_zero: float32}``."""
    x = x.to(torch.float32)
    low, high = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    scale = (high - low) / 255.0
    # NOTE: a constant slice has scale 0; its codes are 0 and it decodes to ``low`` exactly
    codes = torch.where(scale > 0, (x - low) / torch.where(scale > 0, scale, 1.0), 0.0)
    codes = codes.round_().clamp_(0, 255).to(torch.uint8)
    return {name: codes.contiguous(), f"{name}_scale": scale.contiguous(), f"{name}_zero": low.contiguous()}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """``t``'s bytes as a flat uint8 array (for checksums), without a copy when contiguous."""
    return t.contiguous().view(torch.uint8).numpy().reshape(-1)
