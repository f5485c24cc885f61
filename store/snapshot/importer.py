"""Importing a snapshot archive (``store.snapshot.format``): refuse one made for another model,
format or layout, naming the field; verify every block; publish the rest through the writer,
exactly as saves are published (``store.writer.BlockWriter.publish_verified``).

An import is a trust decision: verification proves a block is internally consistent (its bytes,
its hash chain, its tensors' checksum), which whoever made the archive can always arrange; it
cannot prove the K/V was computed from those tokens by this model.
"""

from __future__ import annotations

import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import xxhash

from hashing import NamespaceIdentity
from store.interface import KVSpec
from store.serde import BlockVerificationError, max_blob_bytes
from store.snapshot.format import (
    MANIFEST,
    ManifestEntry,
    SnapshotError,
    SnapshotMismatch,
    block_member,
    depth,
    entry_name,
    manifest_entry,
    read_manifest,
    verify,
)
from store.writer import BlockWriter, Stored

BATCH_BYTES = 64 * 1024 * 1024
"""Verified blob bytes held before they are published (one index round trip per batch)."""
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
"""The largest manifest read (about 300,000 blocks)."""


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
    writer: BlockWriter,
    spec: KVSpec,
    identities: Mapping[str, NamespaceIdentity],
    ttl_s: int,
) -> ImportReport:
    """Store and index the verified blocks of a snapshot archive (``source``: seekable).

    Args:
        writer: the serving cache's writer, through which blocks are published.
        spec: the K/V layout every block must have.
        identities: this deployment's identity for each tenant it serves.
        ttl_s: the TTL in seconds of the imported blocks.

    Raises:
        SnapshotError: not a snapshot, or a tenant this deployment does not serve.
        SnapshotMismatch: a snapshot made by another model, format or layout (the message names
            the first identity field that differs).
        store.errors.StoreUnavailable: the index failed (blocks published before stay).
    """
    try:
        tar = tarfile.open(fileobj=source, mode="r:")
    except tarfile.TarError as exc:
        raise SnapshotError(f"not a kvproxy snapshot: not a tar archive ({exc})") from exc
    with tar:
        _check_member(tar, MANIFEST, None, MAX_MANIFEST_BYTES, SnapshotError)
        manifest = read_manifest(tar)
        identity = _identity(manifest, identities)
        blocks = manifest["blocks"]
        report = ImportReport(identity.tenant, identity.digest().hex(), len(blocks))
        run = _Import(tar, writer, spec, identity, ttl_s, report)
        # NOTE: parents first, so a block whose parent was rejected is rejected too: it could
        # never be served (its K/V depends on the parent's)
        for block in sorted(blocks, key=depth):
            run.add(block)
        run.flush()
    return run.report


def _identity(manifest: dict[str, Any], identities: Mapping[str, NamespaceIdentity]) -> NamespaceIdentity:
    tenant = manifest["tenant"]
    if tenant not in identities:
        served = ", ".join(sorted(identities))
        raise SnapshotError(
            f"the snapshot's tenant {tenant!r} is not a tenant of this server (its tenants: {served})"
        )
    identity = identities[tenant]
    name = identity.differs_from(manifest)
    if name is not None:
        here = identity.manifest()[name]
        raise SnapshotMismatch(
            f"the snapshot's {name} {manifest.get(name)!r} differs from this server's {here!r}"
        )
    return identity


def _check_member(
    tar: tarfile.TarFile, name: str, size: int | None, limit: int, error: type[Exception]
) -> tarfile.TarInfo:
    """The archive's regular file ``name``, declared ``size`` bytes (None: any) and at most
    ``limit``, checked before a byte of it is read.

    Raises:
        ``error``: naming the member and what is wrong with it.
    """
    try:
        info = tar.getmember(name)
    except KeyError:
        raise error(f"{name} is missing from the archive") from None
    if not info.isfile() or info.issparse():
        raise error(f"{name} is not a plain file in the archive")
    if info.size > limit or (size is not None and info.size != size):
        expected = f"the manifest's {size}" if size is not None else f"at most {limit}"
        raise error(f"{name} declares {info.size} bytes, not {expected}")
    return info


class _Import:
    """One import's progress: verified blocks waiting to be published, and what was rejected."""

    def __init__(
        self,
        tar: tarfile.TarFile,
        writer: BlockWriter,
        spec: KVSpec,
        identity: NamespaceIdentity,
        ttl_s: int,
        report: ImportReport,
    ) -> None:
        self.tar, self.writer, self.spec, self.report = tar, writer, spec, report
        self.namespace, self.ttl_s = identity.digest(), ttl_s
        self.rejected: set[str] = set()
        self.verified: set[str] = set()
        self.batch: list[tuple[str, Stored]] = []

    def add(self, block: Any) -> None:
        """Verify one manifest entry's block and queue it, or reject it with the reason."""
        name = entry_name(block)
        try:
            entry = manifest_entry(block)
            if entry.parent is not None and entry.parent.hex() in self.rejected:
                raise BlockVerificationError("its parent block was rejected, so it could never be served")
            stored = self._read(entry)
        except (tarfile.TarError, BlockVerificationError) as exc:
            self._reject(name, str(exc))
            return
        self.verified.add(name)
        self.batch.append((name, stored))
        if sum(len(s.data or b"") for _, s in self.batch) >= BATCH_BYTES:
            self.flush()

    def _read(self, entry: ManifestEntry) -> Stored:
        member = block_member(entry.block_hash.hex())
        info = _check_member(self.tar, member, entry.size, max_blob_bytes(self.spec), BlockVerificationError)
        source = self.tar.extractfile(info)
        assert source is not None  # a regular file
        data = source.read(info.size)
        if xxhash.xxh3_128_hexdigest(data) != entry.digest:
            raise BlockVerificationError("its bytes differ from the manifest's digest (damaged)")
        block = verify(data, self.namespace, self.spec, entry.block_hash, entry.parent, entry.position)
        return Stored(block, entry.parent, self.ttl_s, data)

    def flush(self) -> None:
        """Publish the queued blocks whose parent is verified in this snapshot or cached here."""
        batch, self.batch = self.batch, []
        orphans = self._orphans([s for _, s in batch])
        kept: list[tuple[str, Stored]] = []
        for name, stored in batch:
            parent = stored.parent.hex() if stored.parent is not None else None
            if parent in self.rejected:
                self._reject(name, "its parent block was rejected, so it could never be served")
            elif parent in orphans:
                self._reject(name, "its parent block is neither in the snapshot nor cached here")
            else:
                kept.append((name, stored))
        if not kept:
            return
        published = self.writer.publish_verified(self.namespace, [s for _, s in kept])
        for (name, _), fresh in zip(kept, published.stored, strict=True):
            if fresh is None:
                self._reject(name, f"cannot be stored: {published.failure}")
            elif fresh:
                self.report.imported += 1
            else:
                self.report.already_cached += 1

    def _orphans(self, batch: list[Stored]) -> set[str]:
        """Hex of the parents in ``batch`` neither verified in this snapshot nor cached here: a
        block under one could never be served (and the collector would remove it)."""
        outside = {s.parent.hex(): s.parent for s in batch if s.parent is not None}
        wanted = [(h, p) for h, p in outside.items() if h not in self.verified]
        if not wanted:
            return set()
        missing = self.writer.missing(self.namespace, [p for _, p in wanted])
        return {h for (h, _), gone in zip(wanted, missing, strict=True) if gone}

    def _reject(self, name: str, reason: str) -> None:
        self.report.rejected.append({"hash": name, "reason": reason})
        self.rejected.add(name)
        self.verified.discard(name)
