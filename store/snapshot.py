"""Portable cache snapshots: a namespace's blocks, as stored, in one tar archive with a manifest.

Archive layout (``SNAPSHOT_VERSION`` 1; tar, uncompressed: blocks do not compress)::

    blocks/{hash_hex}.safetensors   each block's blob, byte for byte as the blob store holds it
    manifest.json                   written last: {"kind", "snapshot_version", "created", the
                                    identity (model, model_fingerprint, kv_dtype, weights, device,
                                    block_size, block_format_version, tenant, namespace), "blocks":
                                    [{"hash", "parent", "index", "tokens", "bytes", "xxh3_128"}]}

Import (``store.snapshot_import``) refuses a snapshot whose identity differs from the target's
(naming the first field that does), then verifies every block as a read is verified
(``serde.decode_block``) and more: its bytes against the manifest's digest, and its hash against
its parent and its own token ids (``hashing.chain_hash``). A block that fails is reported and
skipped; the others are stored and indexed as the writer stores them (blob first, then the index
entry).
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterable
from typing import IO, Any

import xxhash

from hashing import BLOCK_SIZE, BlockHash, Namespace, chain_hash
from store.blob_backend import BlobBackend
from store.entries import parse_member
from store.interface import KVSpec
from store.parts import BlockIndex
from store.serde import BlockVerificationError, decode_block, read_header, read_token_ids

KIND = "kvproxy-cache-snapshot"
SNAPSHOT_VERSION = 1
MANIFEST = "manifest.json"
IDENTITY_FIELDS = (
    "block_format_version",
    "block_size",
    "model_fingerprint",
    "kv_dtype",
    "weights",
    "device",
    "namespace",
)
"""Manifest fields that must equal the target's, checked in this order (``model`` is only a
name, ``tenant`` picks the target namespace)."""


class SnapshotError(ValueError):
    """The archive cannot be imported here; the message says why."""


class SnapshotMismatch(SnapshotError):
    """The snapshot was made by another model, format or layout; the message names the field."""


def verify(
    data: bytes,
    namespace: Namespace,
    spec: KVSpec,
    block_hash: BlockHash,
    parent: BlockHash | None,
    index: int,
) -> None:
    """Check a blob is block ``index`` of ``namespace`` named ``block_hash`` after ``parent``:
    its hash is the chain hash of its own tokens, and ``serde.decode_block`` accepts it.

    Raises:
        BlockVerificationError: any mismatch or unreadable data.
    """
    token_ids = read_token_ids(data)
    if len(token_ids) != BLOCK_SIZE or chain_hash(parent or namespace, token_ids) != block_hash:
        raise BlockVerificationError("the block's hash does not match its parent and token ids")
    decode_block(
        data,
        index=index,
        block_hash=block_hash,
        parent=parent,
        namespace=namespace,
        token_ids=token_ids,
        spec=spec,
    )


def namespace_blocks(index: BlockIndex, namespace: Namespace) -> list[BlockHash]:
    """Every block the index holds for ``namespace``."""
    return [parse_member(m)[1] for batch in index.members(namespace=namespace) for m in batch]


def write_snapshot(
    out: IO[bytes],
    index: BlockIndex,
    blobs: BlobBackend,
    spec: KVSpec,
    namespace: Namespace,
    identity: dict[str, Any],
    hashes: Iterable[BlockHash],
) -> dict[str, Any]:
    """Write the blocks ``hashes`` of ``namespace`` that are indexed, readable and verify into a
    snapshot archive on ``out``; returns the manifest. Blocks the index does not hold are left
    out; its ``skipped`` counts the indexed ones that could not be read or did not verify.

    Raises:
        redis.RedisError: Redis failed; OSError: ``out`` cannot be written.
    """
    wanted = list(dict.fromkeys(hashes))
    missing = index.missing(namespace, wanted) if wanted else []
    indexed = [h for h, gone in zip(wanted, missing, strict=True) if not gone]
    listed: list[dict[str, Any]] = []
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for block_hash in indexed:
            try:
                data = blobs.read(namespace, block_hash)
                header = read_header(data)
                parent = (
                    BlockHash(bytes.fromhex(header["parent_hash"])) if header.get("parent_hash") else None
                )
                position = int(header.get("block_index", "-1"))
                verify(data, namespace, spec, block_hash, parent, position)
            except (OSError, ValueError, BlockVerificationError):
                continue  # NOTE: only blocks that verify travel; the rest are counted as skipped
            _add(tar, f"blocks/{block_hash.hex()}.safetensors", data)
            listed.append(
                {
                    "hash": block_hash.hex(),
                    "parent": parent.hex() if parent else None,
                    "index": position,
                    "tokens": BLOCK_SIZE,
                    "bytes": len(data),
                    "xxh3_128": xxhash.xxh3_128_hexdigest(data),
                }
            )
        manifest = {"kind": KIND, "snapshot_version": SNAPSHOT_VERSION, "created": time.time()}
        manifest |= identity | {"blocks": listed, "skipped": len(indexed) - len(listed)}
        _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def read_manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    """The archive's manifest.

    Raises:
        SnapshotError: no readable manifest, or another kind or version of archive.
    """
    try:
        source = tar.extractfile(MANIFEST)
        manifest = json.loads(source.read()) if source is not None else None
    except (KeyError, ValueError, RecursionError, tarfile.TarError) as exc:
        raise SnapshotError(f"not a kvproxy snapshot: no readable {MANIFEST} ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise SnapshotError(f"not a kvproxy snapshot: {MANIFEST} is not of kind {KIND!r}")
    if type(manifest.get("snapshot_version")) is not int or manifest["snapshot_version"] != SNAPSHOT_VERSION:
        version = manifest.get("snapshot_version")
        raise SnapshotError(f"snapshot_version {version!r} differs from this server's {SNAPSHOT_VERSION}")
    return manifest


def member_bytes(tar: tarfile.TarFile, name: str) -> bytes:
    """The bytes of the archive's file ``name``.

    Raises:
        BlockVerificationError: no such file.
    """
    try:
        source = tar.extractfile(name)
    except KeyError:
        source = None
    if source is None:
        raise BlockVerificationError("missing from the archive")
    return source.read()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))
