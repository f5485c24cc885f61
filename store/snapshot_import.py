"""Importing a snapshot archive (``store.snapshot`` has the format): refuse one made for another
model, format or layout, naming the field; verify every block; store and index the rest as the
writer does (blob first, then the index entry)."""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import xxhash

from hashing import BlockHash, Namespace
from store.blob_backend import BlobBackend
from store.entries import new_entry
from store.interface import KVSpec
from store.parts import BlockIndex
from store.serde import BlockVerificationError
from store.snapshot import IDENTITY_FIELDS, SnapshotError, member_bytes, read_manifest, verify


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
        SnapshotError: not a snapshot, or one made by another model, format or layout (the
            message names the first field of ``IDENTITY_FIELDS`` that differs).
        redis.RedisError: Redis failed.
    """
    try:
        tar = tarfile.open(fileobj=source, mode="r:")
    except tarfile.TarError as exc:
        raise SnapshotError(f"not a kvproxy snapshot: not a tar archive ({exc})") from exc
    with tar:
        manifest = read_manifest(tar)
        tenant = str(manifest.get("tenant"))
        here = identity_for(tenant)
        for name in IDENTITY_FIELDS:
            if manifest.get(name) != here[name]:
                raise SnapshotError(
                    f"the snapshot's {name} {manifest.get(name)!r} differs from this server's {here[name]!r}"
                )
        namespace = Namespace(bytes.fromhex(here["namespace"]))
        report = ImportReport(tenant, here["namespace"], blocks=len(manifest.get("blocks") or []))
        for block in manifest.get("blocks") or []:
            _import_block(tar, block, index, blobs, spec, namespace, ttl_s, report)
    return report


def _import_block(
    tar: tarfile.TarFile,
    block: dict[str, Any],
    index: BlockIndex,
    blobs: BlobBackend,
    spec: KVSpec,
    namespace: Namespace,
    ttl_s: int,
    report: ImportReport,
) -> None:
    name = str(block.get("hash"))
    try:
        block_hash = BlockHash(bytes.fromhex(name))
        parent = BlockHash(bytes.fromhex(block["parent"])) if block.get("parent") else None
        position = int(block["index"])
        data = member_bytes(tar, f"blocks/{name}.safetensors")
        if xxhash.xxh3_128_hexdigest(data) != block.get("xxh3_128"):
            raise BlockVerificationError("its bytes differ from the manifest's digest (damaged)")
        verify(data, namespace, spec, block_hash, parent, position)
    except (KeyError, ValueError, TypeError, tarfile.TarError, BlockVerificationError) as exc:
        reason = str(exc) if isinstance(exc, BlockVerificationError) else f"bad manifest entry ({exc!r})"
        report.rejected.append({"hash": name, "reason": reason})
        return
    if not index.missing(namespace, [block_hash])[0]:
        report.already_cached += 1
        return
    try:
        blobs.write(namespace, block_hash, data)
    except OSError as exc:
        report.rejected.append({"hash": name, "reason": f"cannot be stored: {exc}"})
        return
    entry = new_entry(blobs.name(namespace, block_hash), len(data), parent)
    index.publish(namespace, block_hash, parent, position, entry, ttl_s, time.time())
    report.imported += 1
