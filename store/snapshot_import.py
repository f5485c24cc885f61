"""Importing a snapshot archive (``store.snapshot`` has the format): refuse one made for another
model, format or layout, naming the field; verify every block; store and index the rest as the
writer does (blob first, then the index entry)."""

from __future__ import annotations

import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

import xxhash

from hashing import BlockHash, Namespace
from store.blob_backend import BlobBackend
from store.entries import new_entry
from store.interface import KVSpec
from store.parts import BlockIndex
from store.serde import BlockVerificationError
from store.snapshot import (
    IDENTITY_FIELDS,
    SnapshotError,
    SnapshotMismatch,
    member_bytes,
    read_manifest,
    verify,
)


@dataclass
class ImportReport:
    """What an import did: blocks stored, already cached, and rejected (hash hex, reason)."""

    tenant: str
    namespace: str
    blocks: int = 0
    imported: int = 0
    already_cached: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)


def import_snapshot(
    source: IO[bytes],
    index: BlockIndex,
    blobs: BlobBackend,
    spec: KVSpec,
    identity_for: Callable[[str], dict[str, Any]],
    ttl_s: int,
) -> ImportReport:
    """Store and index the verified blocks of a snapshot archive (``source``: seekable).

    Args:
        identity_for: this deployment's identity for a tenant (the fields of ``IDENTITY_FIELDS``).
        ttl_s: the TTL in seconds of the imported index entries.

    Raises:
        SnapshotError: not a snapshot, or a tenant ``identity_for`` refuses.
        SnapshotMismatch: a snapshot made by another model, format or layout (the message names
            the first field of ``IDENTITY_FIELDS`` that differs).
        redis.RedisError: Redis failed.
    """
    try:
        tar = tarfile.open(fileobj=source, mode="r:")
    except tarfile.TarError as exc:
        raise SnapshotError(f"not a kvproxy snapshot: not a tar archive ({exc})") from exc
    with tar:
        manifest = read_manifest(tar)
        tenant = manifest.get("tenant")
        if not isinstance(tenant, str):
            raise SnapshotError("not a kvproxy snapshot: the manifest names no tenant")
        here = identity_for(tenant)
        for name in IDENTITY_FIELDS:
            theirs = manifest.get(name)
            if type(theirs) is not type(here[name]) or theirs != here[name]:
                raise SnapshotMismatch(
                    f"the snapshot's {name} {theirs!r} differs from this server's {here[name]!r}"
                )
        blocks = manifest.get("blocks")
        if not isinstance(blocks, list):
            raise SnapshotError("not a kvproxy snapshot: the manifest's `blocks` is not a list")
        namespace = Namespace(bytes.fromhex(here["namespace"]))
        report = ImportReport(tenant, here["namespace"], blocks=len(blocks))
        # NOTE: parents first, so a block whose parent was rejected is rejected too: it could
        # never be served (its K/V depends on the parent's)
        rejected: set[str] = set()
        for block in sorted(blocks, key=_depth):
            _import_block(tar, block, index, blobs, spec, namespace, ttl_s, report, rejected)
    return report


def _depth(block: Any) -> int:
    """A manifest entry's block index, for ordering (malformed entries first)."""
    position = block.get("index") if isinstance(block, dict) else None
    return position if isinstance(position, int) else -1


class _Entry(NamedTuple):
    block_hash: BlockHash
    parent: BlockHash | None
    position: int
    digest: str


def _entry(block: Any) -> _Entry:
    """One block's manifest entry, checked.

    Raises:
        BlockVerificationError: naming the field that is missing or malformed.
    """
    if not isinstance(block, dict):
        raise BlockVerificationError("its manifest entry is not an object")
    fields = [block.get("hash"), block.get("parent") or "0" * 32]
    if not all(isinstance(f, str) and re.fullmatch(r"[0-9a-f]{32}", f) for f in fields):
        raise BlockVerificationError("its manifest entry's `hash` or `parent` is not 32 hex digits")
    position, digest = block.get("index"), block.get("xxh3_128")
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        raise BlockVerificationError("its manifest entry's `index` is not a block position")
    if not isinstance(digest, str):
        raise BlockVerificationError("its manifest entry has no `xxh3_128` digest")
    parent = BlockHash(bytes.fromhex(block["parent"])) if block.get("parent") else None
    return _Entry(BlockHash(bytes.fromhex(block["hash"])), parent, position, digest)


def _import_block(
    tar: tarfile.TarFile,
    block: Any,
    index: BlockIndex,
    blobs: BlobBackend,
    spec: KVSpec,
    namespace: Namespace,
    ttl_s: int,
    report: ImportReport,
    rejected: set[str],
) -> None:
    name = str(block.get("hash")) if isinstance(block, dict) else repr(block)
    try:
        entry = _entry(block)
        if entry.parent is not None and entry.parent.hex() in rejected:
            raise BlockVerificationError("its parent block was rejected, so it could never be served")
        data = member_bytes(tar, f"blocks/{name}.safetensors")
        if xxhash.xxh3_128_hexdigest(data) != entry.digest:
            raise BlockVerificationError("its bytes differ from the manifest's digest (damaged)")
        verify(data, namespace, spec, entry.block_hash, entry.parent, entry.position)
    except (tarfile.TarError, BlockVerificationError) as exc:
        report.rejected.append({"hash": name, "reason": str(exc)})
        rejected.add(name)
        return
    if not index.missing(namespace, [entry.block_hash])[0]:
        report.already_cached += 1
        return
    try:
        blobs.write(namespace, entry.block_hash, data)
    except OSError as exc:
        report.rejected.append({"hash": name, "reason": f"cannot be stored: {exc}"})
        rejected.add(name)
        return
    index_entry = new_entry(blobs.name(namespace, entry.block_hash), len(data), entry.parent)
    index.publish(namespace, entry.block_hash, entry.parent, entry.position, index_entry, ttl_s, time.time())
    report.imported += 1
