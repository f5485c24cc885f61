"""Malformed safetensors blobs, each made from a good blob's bytes: a header inconsistent in one
way (what a torn write, bit rot or a careless or hostile writer of a shared directory leaves),
for tests that every one is a verification failure, never a failed request.

The format (huggingface/safetensors): an 8-byte little-endian header length, a JSON header of
``{name: {dtype, shape, data_offsets}}`` and ``__metadata__``, then the tensors' bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Header = dict[str, Any]


def split(data: bytes) -> tuple[Header, bytes]:
    """A good blob's JSON header and the bytes after it."""
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def join(header: Any, body: bytes) -> bytes:
    """A safetensors file of ``header`` (any JSON value) and ``body``, its length field right."""
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


def edited(change: Callable[[Header], Any]) -> Callable[[bytes], bytes]:
    """Damage that rewrites the header with ``change`` (the tensors' bytes untouched)."""

    def damage(data: bytes) -> bytes:
        header, body = split(data)
        return join(change(header), body)

    return damage


def _set(name: str, field: str, value: Any) -> Callable[[Header], Header]:
    return lambda h: h | {name: h[name] | {field: value}}


def _without(name: str, field: str) -> Callable[[Header], Header]:
    return lambda h: h | {name: {k: v for k, v in h[name].items() if k != field}}


def _offsets(name: str, change: Callable[[int, int], list[Any]]) -> Callable[[Header], Header]:
    return lambda h: _set(name, "data_offsets", change(*h[name]["data_offsets"]))(h)


def _overlapping(h: Header) -> Header:
    """``token_ids`` moved onto ``key``'s first bytes (its own count of bytes)."""
    start, end = h["token_ids"]["data_offsets"]
    key = h["key"]["data_offsets"][0]
    return _set("token_ids", "data_offsets", [key, key + end - start])(h)


def _overlapping_longer(h: Header) -> Header:
    """``token_ids`` reaching 8 bytes into the tensor after it (or before it): 8 bytes too many."""
    start, end = h["token_ids"]["data_offsets"]
    after = any(e["data_offsets"][0] == end for n, e in h.items() if n not in ("__metadata__", "token_ids"))
    return _set("token_ids", "data_offsets", [start, end + 8] if after else [start - 8, end])(h)


def _length_beyond_file(data: bytes) -> bytes:
    return (len(data) + 100).to_bytes(8, "little") + data[8:]


def _non_json(data: bytes) -> bytes:
    length = int.from_bytes(data[:8], "little")
    return data[:8] + b"{\xff" + b"x" * (length - 2) + data[8 + length :]


MALFORMED: dict[str, Callable[[bytes], bytes]] = {
    "header-length-beyond-file": _length_beyond_file,
    "header-not-json": _non_json,
    "header-not-an-object": edited(lambda h: [1, 2, 3]),
    "metadata-not-an-object": edited(lambda h: h | {"__metadata__": ["format"]}),
    "entry-not-an-object": edited(lambda h: h | {"value": 7}),
    "offsets-out-of-range": edited(_offsets("key", lambda s, e: [s, e + 10**6])),
    "offsets-reversed": edited(_offsets("token_ids", lambda s, e: [e, s])),
    "offsets-not-integers": edited(_offsets("token_ids", lambda s, e: [float(s), str(e)])),
    "offsets-missing": edited(_without("token_ids", "data_offsets")),
    "offsets-overlapping": edited(_overlapping),
    "offsets-overlapping-longer": edited(_overlapping_longer),
    "shape-disagrees-with-bytes": edited(_offsets("token_ids", lambda s, e: [s, e - 8])),
    "shape-wrong": edited(_set("token_ids", "shape", [4, 32])),
    "shape-not-a-list": edited(_set("key", "shape", 5)),
    "shape-missing": edited(_without("key", "shape")),
    "dtype-missing": edited(_without("token_ids", "dtype")),
    "dtype-missing-packed": edited(_without("value", "dtype")),
    "dtype-unknown": edited(_set("token_ids", "dtype", "Q7")),
    "tensor-missing": edited(lambda h: {k: v for k, v in h.items() if k != "value"}),
    "tensor-extra": edited(lambda h: h | {"extra": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}),
}
"""Header malformations by name: each turns a good blob's bytes into a malformed blob's."""
