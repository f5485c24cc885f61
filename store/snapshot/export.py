"""Exporting a snapshot archive (``store.snapshot.format``): the blocks of a namespace that are
indexed, readable and verify, byte for byte, and a manifest written last."""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterable
from typing import IO, Any

import xxhash

from hashing import BLOCK_SIZE, BlockHash, Namespace, NamespaceIdentity
from store.entries import parse_member
from store.index.base import BlockIndex
from store.interface import KVSpec
from store.parts import StoreParts
from store.serde import BlockVerificationError, read_header
from store.snapshot.format import KIND, MANIFEST, SNAPSHOT_VERSION, add_member, block_member, verify


def namespace_blocks(index: BlockIndex, namespace: Namespace) -> list[BlockHash]:
    """Every block the index holds for ``namespace`` (not its tails: a snapshot carries blocks,
    and a tail is cheap to compute again).

    Raises:
        redis.RedisError: Redis failed.
    """
    out: list[BlockHash] = []
    for batch in index.members(namespace=namespace):
        entries = index.entries(batch)
        out += [
            parse_member(m)[1] for m, e in zip(batch, entries, strict=True) if e is not None and not e.tail
        ]
    return out


def write_snapshot(
    out: IO[bytes],
    parts: StoreParts,
    spec: KVSpec,
    identity: NamespaceIdentity,
    hashes: Iterable[BlockHash],
    model: str = "",
) -> dict[str, Any]:
    """Write the blocks ``hashes`` of ``identity``'s namespace that are indexed, readable and
    verify into a snapshot archive on ``out``; returns the manifest (``model``: the served name
    it records). Blocks the index does not hold are left out; the manifest's ``skipped`` counts
    the indexed ones that could not be read or did not verify.

    Raises:
        redis.RedisError: Redis failed; OSError: ``out`` cannot be written.
    """
    namespace = identity.digest()
    wanted = list(dict.fromkeys(hashes))
    missing = parts.index.missing(namespace, wanted) if wanted else []
    indexed = [h for h, gone in zip(wanted, missing, strict=True) if not gone]
    listed: list[dict[str, Any]] = []
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for block_hash in indexed:
            try:
                data = parts.blobs.read(namespace, block_hash)
                header = read_header(data)
                parent = (
                    BlockHash(bytes.fromhex(header["parent_hash"])) if header.get("parent_hash") else None
                )
                position = int(header.get("block_index", "-1"))
                verify(data, namespace, spec, block_hash, parent, position)
            except (OSError, ValueError, BlockVerificationError):
                continue  # NOTE: only blocks that verify travel; the rest are counted as skipped
            add_member(tar, block_member(block_hash.hex()), data)
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
        manifest = {
            "kind": KIND,
            "snapshot_version": SNAPSHOT_VERSION,
            "created": time.time(),
            "model": model,
        }
        manifest |= identity.manifest() | {"blocks": listed, "skipped": len(indexed) - len(listed)}
        add_member(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest
