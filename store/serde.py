"""One block <-> one safetensors file, with verification on the way back.

File layout (docs/design.md, "Storage"): tensors ``key`` and ``value``
``[num_layers, num_kv_heads, 128, head_dim]`` in the KV dtype, ``token_ids`` ``[128]`` int64, and
string metadata ``format``, ``namespace``, ``block_hash``, ``parent_hash`` (empty for block 0),
``block_index``, ``dtype`` and ``checksum`` (xxh3-128 of the three tensors' bytes, so a flipped
bit in the K/V is caught as surely as a wrong header). Only safetensors, never pickle: a file is
parsed as data, so a crafted blob can at worst fail verification.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch
import xxhash
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from hashing import BLOCK_SIZE, FORMAT_VERSION, BlockHash, Namespace
from store.interface import KVBlock, KVSpec


class BlockVerificationError(Exception):
    """A stored blob does not hold the block the request needs; the message says why."""


HEADER_BYTES = 64 * 1024
"""More than a block blob's safetensors header and token ids ever take."""


def max_blob_bytes(spec: KVSpec) -> int:
    """The most bytes a blob of ``spec``'s blocks can hold (its K/V plus ``HEADER_BYTES``)."""
    return spec.block_bytes + HEADER_BYTES


def encode_block(block: KVBlock, namespace: Namespace, parent: BlockHash | None, spec: KVSpec) -> bytes:
    """Serialize ``block`` to safetensors bytes (about ``spec.block_bytes`` bytes)."""
    tensors = {
        "key": block.key.to(spec.torch_dtype).contiguous(),
        "value": block.value.to(spec.torch_dtype).contiguous(),
        "token_ids": torch.tensor(block.token_ids, dtype=torch.int64),
    }
    metadata = _metadata(block.index, block.block_hash, namespace, parent, spec)
    return st_save(tensors, metadata=metadata | {"checksum": _checksum(tensors)})


def decode_block(
    data: bytes,
    *,
    index: int,
    block_hash: BlockHash,
    parent: BlockHash | None,
    namespace: Namespace,
    token_ids: Sequence[int],
    spec: KVSpec,
) -> KVBlock:
    """Parse a blob and check it is exactly the block the request expects.

    Checked: format version, namespace, block hash, parent hash, block index, the 128 token ids,
    dtype and shape of ``key`` and ``value``. A hash match alone is never trusted, so a hash
    collision (accidental or crafted) can only cause a miss.

    Raises:
        BlockVerificationError: unreadable data or any mismatch.
    """
    try:
        # NOTE: safetensors parses the data itself; malformed or pickled data raises here.
        tensors = st_load(data)
        metadata = _read_metadata(data)
    except Exception as exc:  # any parse failure is a verification failure
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc

    expected = _metadata(index, block_hash, namespace, parent, spec)
    for name, value in expected.items():
        if metadata.get(name) != value:
            raise BlockVerificationError(f"metadata {name}={metadata.get(name)!r}, expected {value!r}")
    if set(tensors) != {"key", "value", "token_ids"}:
        raise BlockVerificationError(f"tensors {sorted(tensors)}, expected key, value, token_ids")
    for name in ("key", "value"):
        t = tensors[name]
        if t.dtype != spec.torch_dtype or tuple(t.shape) != spec.block_shape:
            raise BlockVerificationError(
                f"{name} is {t.dtype} {tuple(t.shape)}, expected {spec.dtype} {spec.block_shape}"
            )
    stored_ids = tensors["token_ids"]
    if stored_ids.dtype != torch.int64 or stored_ids.tolist() != list(token_ids):
        raise BlockVerificationError("token ids differ from the request (hash collision?)")
    if metadata.get("checksum") != _checksum(tensors):
        raise BlockVerificationError("tensor bytes do not match their checksum (corrupt file)")
    return KVBlock(index, block_hash, tuple(token_ids), tensors["key"], tensors["value"])


def _metadata(
    index: int, block_hash: BlockHash, namespace: Namespace, parent: BlockHash | None, spec: KVSpec
) -> dict[str, str]:
    return {
        "format": f"kvproxy-block-v{FORMAT_VERSION}",
        "namespace": namespace.hex(),
        "block_hash": block_hash.hex(),
        "parent_hash": parent.hex() if parent is not None else "",
        "block_index": str(index),
        "block_size": str(BLOCK_SIZE),
        "dtype": spec.dtype,
    }


def read_token_ids(data: bytes) -> list[int]:
    """The token ids a blob holds (for explaining misses; not a verification).

    Raises:
        BlockVerificationError: unreadable data.
    """
    try:
        return st_load(data)["token_ids"].tolist()
    except Exception as exc:
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc


def read_header(data: bytes) -> dict[str, str]:
    """The string metadata a blob claims (format, namespace, block hash, parent hash, block
    index, ...); not a verification.

    Raises:
        BlockVerificationError: unreadable data.
    """
    try:
        return _read_metadata(data)
    except Exception as exc:
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    """Hex xxh3-128 over the bytes of ``key``, ``value`` and ``token_ids``, in that order."""
    digest = xxhash.xxh3_128()
    for name in ("key", "value", "token_ids"):
        digest.update(tensors[name].contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()


def _read_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header (8-byte little-endian length, then JSON)."""
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    metadata = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in metadata.items()}
