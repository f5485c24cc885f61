"""One block <-> one safetensors file, with verification on the way back.

File layout (docs/design.md, "Storage"): tensors ``key`` and ``value``
``[num_layers, num_kv_heads, 128, head_dim]`` in the KV dtype, ``token_ids`` ``[128]`` int64, and
string metadata ``format``, ``namespace``, ``block_hash``, ``parent_hash`` (empty for block 0),
``block_index``, ``dtype`` and ``checksum`` (xxh3-128 of the three tensors' bytes, so a flipped
bit in the K/V is caught as surely as a wrong header). Only safetensors, never pickle: a file is
parsed as data, so a crafted blob can at worst fail verification.

A tail (``hashing.tails``) is stored the same way with its L < 128 tokens: tensors
``[num_layers, num_kv_heads, L, head_dim]`` and ``token_ids`` ``[L]``, ``block_hash`` its tail
hash, ``parent_hash`` its tip (empty for the root), ``block_index`` the number of blocks before
it, and ``tail_tokens`` L (which a block's header lacks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch
import xxhash
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from hashing import BLOCK_SIZE, FORMAT_VERSION, BlockHash, Namespace, tail_hash
from store.interface import KVBlock, KVSpec


class BlockVerificationError(Exception):
    """A stored blob does not hold the block the request needs; the message says why."""


HEADER_BYTES = 64 * 1024
"""More than a block blob's safetensors header and token ids ever take."""


def max_blob_bytes(spec: KVSpec) -> int:
    """The most bytes a blob of ``spec``'s blocks can hold (its K/V plus ``HEADER_BYTES``)."""
    return spec.block_bytes + HEADER_BYTES


def encode_block(block: KVBlock, namespace: Namespace, parent: BlockHash | None, spec: KVSpec) -> bytes:
    """Serialize ``block`` (or a tail; ``parent`` is then its tip) to safetensors bytes (about
    ``spec.block_bytes`` bytes for a block)."""
    tensors = {
        "key": block.key.to(spec.torch_dtype).contiguous(),
        "value": block.value.to(spec.torch_dtype).contiguous(),
        "token_ids": torch.tensor(block.token_ids, dtype=torch.int64),
    }
    tail = len(block.token_ids) if block.is_tail else 0
    metadata = _metadata(block.index, block.block_hash, namespace, parent, spec, tail)
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
    dtype and shape of ``key`` and ``value``, and the checksum. A hash match alone is never
    trusted, so a hash collision (accidental or crafted) can only cause a miss.

    Raises:
        BlockVerificationError: unreadable data or any mismatch.
    """
    expected = _metadata(index, block_hash, namespace, parent, spec)
    tensors = _verified(data, expected, BLOCK_SIZE, spec)
    if tensors["token_ids"].tolist() != list(token_ids):
        raise BlockVerificationError("token ids differ from the request (hash collision?)")
    return KVBlock(index, block_hash, tuple(token_ids), tensors["key"], tensors["value"])


def decode_tail(
    data: bytes,
    *,
    index: int,
    tail: BlockHash,
    tip: BlockHash | None,
    namespace: Namespace,
    length: int,
    token_ids: Sequence[int],
    spec: KVSpec,
) -> KVBlock:
    """Parse a tail's blob and check it is the tail ``tail`` of ``length`` tokens after ``tip``
    (None: the root) at chain ``index``, whose first ``len(token_ids)`` tokens are ``token_ids``.

    Checked: as ``decode_block`` (with ``tail_tokens``), and that the tail's own token ids hash to
    its name (``hashing.tail_hash``), so a tail served for its first L - 1 tokens is still the
    tail its name says.

    Raises:
        BlockVerificationError: unreadable data or any mismatch.
    """
    expected = _metadata(index, tail, namespace, tip, spec, length)
    tensors = _verified(data, expected, length, spec)
    stored = tuple(tensors["token_ids"].tolist())
    if stored[: len(token_ids)] != tuple(token_ids) or tail_hash(tip or namespace, stored) != tail:
        raise BlockVerificationError("token ids differ from the request (hash collision?)")
    return KVBlock(index, tail, stored, tensors["key"], tensors["value"])


def _verified(data: bytes, expected: dict[str, str], tokens: int, spec: KVSpec) -> dict[str, torch.Tensor]:
    """The tensors of a blob whose header holds ``expected`` and whose K/V hold ``tokens``
    positions of ``spec``'s shape and dtype, checksum checked.

    Raises:
        BlockVerificationError: unreadable data or any mismatch.
    """
    try:
        # NOTE: safetensors parses the data itself; malformed or pickled data raises here.
        tensors = st_load(data)
        metadata = _read_metadata(data)
    except Exception as exc:  # any parse failure is a verification failure
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc
    for name, value in expected.items():
        if metadata.get(name) != value:
            raise BlockVerificationError(f"metadata {name}={metadata.get(name)!r}, expected {value!r}")
    if "tail_tokens" not in expected and "tail_tokens" in metadata:
        raise BlockVerificationError("a tail, expected a block")
    if set(tensors) != {"key", "value", "token_ids"}:
        raise BlockVerificationError(f"tensors {sorted(tensors)}, expected key, value, token_ids")
    layers, heads, _, dim = spec.block_shape
    shape = (layers, heads, tokens, dim)
    for name in ("key", "value"):
        t = tensors[name]
        if t.dtype != spec.torch_dtype or tuple(t.shape) != shape:
            raise BlockVerificationError(
                f"{name} is {t.dtype} {tuple(t.shape)}, expected {spec.dtype} {shape}"
            )
    ids = tensors["token_ids"]
    if ids.dtype != torch.int64 or tuple(ids.shape) != (tokens,):
        raise BlockVerificationError(
            f"token_ids is {ids.dtype} {tuple(ids.shape)}, expected int64 ({tokens},)"
        )
    if metadata.get("checksum") != _checksum(tensors):
        raise BlockVerificationError("tensor bytes do not match their checksum (corrupt file)")
    return tensors


def _metadata(
    index: int,
    block_hash: BlockHash,
    namespace: Namespace,
    parent: BlockHash | None,
    spec: KVSpec,
    tail: int = 0,
) -> dict[str, str]:
    return ({"tail_tokens": str(tail)} if tail else {}) | {
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
