"""Reading a safetensors file in place: its header parsed as data, its tensors' bytes sliced
without a copy, so a blob's packed arrays are unpacked straight from the bytes read.

The format (huggingface/safetensors): an 8-byte little-endian header length, a JSON header naming
each tensor's ``dtype``, ``shape`` and ``data_offsets`` (from the end of the header) and an
optional ``__metadata__`` of strings, then the tensors' bytes.
"""

from __future__ import annotations

import json
from typing import TypedDict

import torch

from store import codec

HEADER_BYTES = 64 * 1024
"""More than a block blob's safetensors header and token ids ever take."""
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
"""Safetensors' names of the dtypes a blob stores unpacked."""


class TensorEntry(TypedDict):
    """A tensor as the header names it: its dtype (``"F32"``, ``"U8"``, ...), shape and byte
    range (from the end of the header). As read from the file: ``parse`` checks the range only."""

    dtype: str
    shape: list[int]
    data_offsets: list[int]


def parse(data: bytes) -> tuple[dict[str, str], dict[str, TensorEntry], memoryview]:
    """A safetensors file's metadata, tensor entries and the bytes they index, every offset
    checked to lie within them.

    Raises:
        ValueError: not such a file (a header over ``HEADER_BYTES``, offsets outside the data).
    """
    if len(data) < 8 or (length := int.from_bytes(data[:8], "little")) > min(len(data) - 8, HEADER_BYTES):
        raise ValueError("no safetensors header")
    header = json.loads(bytes(data[8 : 8 + length]))
    metadata = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + length :]
    for name, entry in header.items():
        start, end = entry["data_offsets"]
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= len(body)):
            raise ValueError(f"tensor {name!r} lies outside the file")
    return {str(k): str(v) for k, v in metadata.items()}, header, body


def array(
    entry: TensorEntry, body: memoryview, shape: tuple[int, ...], dtype: torch.dtype, *, packed: bool
) -> torch.Tensor:
    """The tensor ``entry`` names, of ``shape`` and ``dtype``: ``packed`` (a uint8 tensor of the
    bytes ``store.codec.compress`` made) or stored as it is.

    Raises:
        ValueError: a tensor of another dtype or shape, or bytes that do not unpack.
    """
    start, end = entry["data_offsets"]
    data = body[start:end]
    if packed:
        if entry["dtype"] != "U8" or len(entry["shape"]) != 1:
            raise ValueError(f"a packed array is {entry['dtype']} {entry['shape']}, expected U8")
        return codec.decompress(data, shape, dtype)
    name = DTYPES.get(dtype)
    if entry["dtype"] != name or tuple(entry["shape"]) != shape:
        raise ValueError(f"a tensor is {entry['dtype']} {tuple(entry['shape'])}, expected {name} {shape}")
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)
