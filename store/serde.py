"""One block <-> one safetensors file, with verification on the way back.

File layout (docs/design.md, "Storage"), blob version 2: the arrays of the namespace's block
format (``store.codec``: ``key`` and ``value``, and an int8 block's scales and zero points), each a
``uint8`` tensor holding its bytes packed by ``store.codec.CODEC``; ``token_ids`` ``[128]`` int64;
and string metadata ``format``, ``blob_version``, ``block_format``, ``codec``, ``namespace``,
``block_hash``, ``parent_hash`` (empty for block 0), ``block_index``, ``dtype`` (the model's K/V
dtype) and ``checksum``: xxh3-128 of the arrays' unpacked bytes and the token ids, checked after
decompression, so a flipped bit in the K/V is caught as surely as a wrong header. Only
safetensors, never pickle: a file is parsed as data, so a crafted blob can at worst fail
verification.

Blob version 1 (no ``blob_version``, written before block formats) holds ``key`` and ``value``
``[num_layers, num_kv_heads, 128, head_dim]`` unpacked in the K/V dtype, checksummed the same way;
it is read as an exact block, so a store written then is still served.

A tail (``hashing.tails``) is stored the same way with its L < 128 tokens: arrays of L positions,
``token_ids`` ``[L]``, ``block_hash`` its tail hash, ``parent_hash`` its tip (empty for the root),
``block_index`` the number of blocks before it, and ``tail_tokens`` L (which a block's header lacks).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import xxhash
from safetensors.torch import save as st_save

from hashing import BLOCK_SIZE, FORMAT_VERSION, BlockHash, Namespace, tail_hash
from store import codec
from store.blob_view import HEADER_BYTES, array, parse
from store.interface import KVBlock, KVSpec


class BlockVerificationError(Exception):
    """A stored blob does not hold the block the request needs; the message says why."""


BLOB_VERSION = 2
"""The layout ``encode_block`` writes (the module docstring: version 1 is still read)."""


def max_blob_bytes(spec: KVSpec) -> int:
    """The most bytes a blob of ``spec``'s blocks can hold (its K/V plus ``HEADER_BYTES``)."""
    return spec.block_bytes + HEADER_BYTES


def read_bound(spec: KVSpec) -> int:
    """The most bytes the cache reads of one blob (or tail) of ``spec``'s blocks: twice
    ``max_blob_bytes`` plus 1 MiB, generous (a codec's worst case, a newer header) yet small
    enough that a huge or sparse file in a blob's place is refused from its size, unread."""
    return 2 * max_blob_bytes(spec) + READ_SLACK_BYTES


READ_SLACK_BYTES = 1 << 20


def encode_block(block: KVBlock, namespace: Namespace, parent: BlockHash | None, spec: KVSpec) -> bytes:
    """Serialize ``block`` (or a tail; ``parent`` is then its tip) to a version-2 blob in
    ``spec.block_format`` (at most ``max_blob_bytes(spec)`` bytes)."""
    arrays = codec.encode(block.key.to(spec.torch_dtype), block.value.to(spec.torch_dtype), spec.block_format)
    token_ids = torch.tensor(block.token_ids, dtype=torch.int64)
    tensors = {
        name: torch.frombuffer(bytearray(codec.compress(a)), dtype=torch.uint8) for name, a in arrays.items()
    }
    tail = len(block.token_ids) if block.is_tail else 0
    metadata = _metadata(block.index, block.block_hash, namespace, parent, spec, tail) | {
        "blob_version": str(BLOB_VERSION),
        "block_format": spec.block_format,
        "codec": codec.CODEC,
        "checksum": _checksum([*arrays.values(), token_ids]),
    }
    return st_save(tensors | {"token_ids": token_ids}, metadata=metadata)


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
        BlockVerificationError: unreadable data or any mismatch: every exception decoding it.
    """
    with undecodable():
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
        BlockVerificationError: unreadable data or any mismatch: every exception decoding it.
    """
    with undecodable():
        expected = _metadata(index, tail, namespace, tip, spec, length)
        tensors = _verified(data, expected, length, spec)
        stored = tuple(tensors["token_ids"].tolist())
        if stored[: len(token_ids)] != tuple(token_ids) or tail_hash(tip or namespace, stored) != tail:
            raise BlockVerificationError("token ids differ from the request (hash collision?)")
        return KVBlock(index, tail, stored, tensors["key"], tensors["value"])


@contextmanager
def undecodable() -> Iterator[None]:
    """Turns any exception raised decoding one blob into a ``BlockVerificationError``.

    NOTE: a kind, not a list: a blob is bytes from outside (another process, a shared disk, a
    bucket), and however its header or arrays are malformed (a key missing, a shape whose product
    disagrees with its bytes, a token id beyond 32 bits), the caller must see a verification
    failure (a miss, the blob dropped), never another exception that fails the request.
    """
    try:
        yield
    except BlockVerificationError:
        raise
    except Exception as exc:
        raise BlockVerificationError(f"undecodable blob ({type(exc).__name__}: {exc})") from exc


def _verified(data: bytes, expected: dict[str, str], tokens: int, spec: KVSpec) -> dict[str, torch.Tensor]:
    """``key``, ``value`` (in ``spec``'s dtype) and ``token_ids`` of a blob whose header holds
    ``expected`` and whose arrays hold ``tokens`` positions of ``spec``'s shape, checksum checked.

    Raises:
        BlockVerificationError: unreadable data or any mismatch.
    """
    try:
        # NOTE: the header is parsed as data; malformed or pickled data raises here.
        metadata, entries, body = parse(data)
    except Exception as exc:  # any parse failure is a verification failure
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc
    for name, value in expected.items():
        if metadata.get(name) != value:
            raise BlockVerificationError(f"metadata {name}={metadata.get(name)!r}, expected {value!r}")
    if "tail_tokens" not in expected and "tail_tokens" in metadata:
        raise BlockVerificationError("a tail, expected a block")
    version = metadata.get("blob_version", "1")
    block_format = metadata.get("block_format", "exact") if version == "2" else "exact"
    if version not in ("1", "2") or block_format != spec.block_format:
        raise BlockVerificationError(
            f"a version-{version} blob of the {block_format} format, expected the {spec.block_format} one"
        )
    if version == "2" and metadata.get("codec") != codec.CODEC:
        raise BlockVerificationError(f"codec {metadata.get('codec')!r}, expected {codec.CODEC!r}")
    layers, heads, _, dim = spec.block_shape
    wanted = codec.shapes(spec.block_format, layers, heads, tokens, dim, spec.torch_dtype)
    if set(entries) != {*wanted, "token_ids"}:
        names = sorted({*wanted, "token_ids"})
        raise BlockVerificationError(f"tensors {sorted(entries)}, expected {names}")
    try:
        arrays = {name: array(entries[name], body, *wanted[name], packed=version == "2") for name in wanted}
        token_ids = array(entries["token_ids"], body, (tokens,), torch.int64, packed=False)
    except ValueError as exc:
        raise BlockVerificationError(str(exc)) from exc
    if metadata.get("checksum") != _checksum([*arrays.values(), token_ids]):
        raise BlockVerificationError("tensor bytes do not match their checksum (corrupt file)")
    kv = codec.decode(arrays, spec.block_format, spec.torch_dtype)
    return {"key": kv[0], "value": kv[1], "token_ids": token_ids}


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
        _, entries, body = parse(data)
        start, end = entries["token_ids"]["data_offsets"]
        return torch.frombuffer(bytearray(body[start:end]), dtype=torch.int64).tolist()
    except Exception as exc:
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc


def read_header(data: bytes) -> dict[str, str]:
    """The string metadata a blob claims (format, namespace, block hash, parent hash, block
    index, ...); not a verification.

    Raises:
        BlockVerificationError: unreadable data.
    """
    try:
        return parse(data)[0]
    except Exception as exc:
        raise BlockVerificationError(f"unreadable blob: {exc}") from exc


def _checksum(arrays: Sequence[torch.Tensor]) -> str:
    """Hex xxh3-128 over the bytes of ``arrays``, in order (a block's, then its token ids)."""
    digest = xxhash.xxh3_128()
    for stored in arrays:
        digest.update(codec.as_numpy(stored).data)
    return digest.hexdigest()
