"""Exporting a snapshot archive (``store.snapshot.format``): the blocks of a namespace that are
indexed, readable and verify, byte for byte, and a manifest written last."""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import IO

import xxhash

from hashing import BLOCK_SIZE, BlockHash, Namespace, NamespaceIdentity
from store.entries import parse_member
from store.index.base import BlockIndex
from store.interface import KVSpec
from store.parts import StoreParts
from store.serde import BlockVerificationError, read_header
from store.snapshot.format import KIND, MANIFEST, SNAPSHOT_VERSION, add_member, block_member, verify


@dataclass(frozen=True)
class ManifestBlock:
    """One block as an export's manifest lists it: hash and parent (hex; None for block 0), its
    position in the chain, tokens, blob bytes and the blob's xxh3_128 (hex)."""

    hash: str
    parent: str | None
    index: int
    tokens: int
    bytes: int
    xxh3_128: str


@dataclass(frozen=True)
class Manifest:
    """What an export wrote (``store.snapshot.format``'s manifest): when (Unix seconds), the
    served name, the identity, the blocks, and how many indexed blocks could not be read or
    did not verify (``skipped``)."""

    created: float
    model: str
    identity: NamespaceIdentity
    blocks: list[ManifestBlock]
    skipped: int

    def as_json(self) -> dict[str, object]:
        """The manifest as ``manifest.json`` holds it."""
        head: dict[str, object] = {
            "kind": KIND,
            "snapshot_version": SNAPSHOT_VERSION,
            "created": self.created,
            "model": self.model,
        }
        blocks = [asdict(b) for b in self.blocks]
        return head | self.identity.manifest() | {"blocks": blocks, "skipped": self.skipped}


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
) -> Manifest:
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
    listed: list[ManifestBlock] = []
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
            digest = xxhash.xxh3_128_hexdigest(data)
            listed.append(
                ManifestBlock(
                    block_hash.hex(),
                    parent.hex() if parent else None,
                    position,
                    BLOCK_SIZE,
                    len(data),
                    digest,
                )
            )
        manifest = Manifest(time.time(), model, identity, listed, len(indexed) - len(listed))
        add_member(tar, MANIFEST, json.dumps(manifest.as_json(), indent=1).encode())
    return manifest
