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
from typing import IO, Any, TypedDict

import xxhash

from hashing import BlockHash, NamespaceIdentity
from store.interface import KVSpec
from store.serde import BlockVerificationError, max_blob_bytes, read_header, read_token_ids
from store.snapshot.format import (
    MANIFEST,
    TAR_ERRORS,
    ManifestEntry,
    SnapshotError,
    SnapshotMismatch,
    block_member,
    check_member,
    check_sizes,
    depth,
    entry_name,
    load_members,
    manifest_entry,
    read_manifest,
    verify,
)
from store.stored import Stored
from store.writer import BlockWriter

BATCH_BYTES = 64 * 1024 * 1024
"""Verified blob bytes held before they are published (one index round trip per batch)."""
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
"""The largest manifest read (about 300,000 blocks)."""


class ImportAnswer(TypedDict):
    """An ``ImportReport`` as JSON: ``rejected`` holds ``{"hash", "reason"}`` objects."""

    tenant: str
    namespace: str
    blocks: int
    imported: int
    already_cached: int
    rejected: list[dict[str, str]]
    awaiting_audit: int


@dataclass
class ImportReport:
    """What an import did: blocks stored, already cached, and rejected (hash hex, reason); with
    ``audit``, how many stored blocks wait for their audit, and the token ids of the chains that
    hold them (for the engine to recompute; not part of the report's JSON)."""

    tenant: str
    namespace: str
    blocks: int = 0
    imported: int = 0
    already_cached: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    awaiting_audit: int = 0
    chains: list[list[int]] = field(default_factory=list, repr=False)

    def as_dict(self) -> ImportAnswer:
        """The report as the import route answers it (its fields in order, ``chains`` left out)."""
        return {
            "tenant": self.tenant,
            "namespace": self.namespace,
            "blocks": self.blocks,
            "imported": self.imported,
            "already_cached": self.already_cached,
            "rejected": self.rejected,
            "awaiting_audit": self.awaiting_audit,
        }


def import_snapshot(
    source: IO[bytes],
    writer: BlockWriter,
    spec: KVSpec,
    identities: Mapping[str, NamespaceIdentity],
    ttl_s: int,
    audit: bool = False,
) -> ImportReport:
    """Store and index the verified blocks of a snapshot archive (``source``: seekable).

    Args:
        writer: the serving cache's writer, through which blocks are published.
        spec: the K/V layout every block must have.
        identities: this deployment's identity for each tenant it serves.
        ttl_s: the TTL in seconds of the imported blocks.
        audit: mark the stored blocks as waiting for their audit (``IndexEntry.imported``):
            lookups serve none of them until the engine has recomputed and confirmed it.

    Raises:
        SnapshotError: not a snapshot, or a tenant this deployment does not serve.
        SnapshotMismatch: a snapshot made by another model, format or layout (the message names
            the first identity field that differs).
        store.errors.StoreUnavailable: the index failed (blocks published before stay).
    """
    try:
        tar = tarfile.open(fileobj=source, mode="r:")
    except TAR_ERRORS as exc:
        raise SnapshotError(f"not a kvproxy snapshot: not a tar archive ({exc})") from exc
    with tar:
        load_members(tar)
        check_member(tar, MANIFEST, None, MAX_MANIFEST_BYTES, SnapshotError)
        manifest = read_manifest(tar)
        identity = _identity(manifest, identities)
        blocks = manifest["blocks"]
        check_sizes(tar, blocks, max_blob_bytes(spec))
        report = ImportReport(identity.tenant, identity.digest().hex(), len(blocks))
        run = _Import(tar, writer, spec, identity, ttl_s, report, audit)
        # NOTE: parents first, so a block whose parent was rejected is rejected too: it could
        # never be served (its K/V depends on the parent's)
        for block in sorted(blocks, key=depth):
            run.add(block)
        run.flush()
    if audit:
        report.chains = run.chains()
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
        audit: bool,
    ) -> None:
        self.tar, self.writer, self.spec, self.report = tar, writer, spec, report
        self.namespace, self.ttl_s, self.audit = identity.digest(), ttl_s, audit
        self.stored: dict[str, tuple[str | None, tuple[int, ...]]] = {}  # hex -> (parent hex, tokens)
        self.rejected: set[str] = set()
        self.seen: set[str] = set()
        self.verified: set[str] = set()
        self.batch: list[tuple[str, Stored]] = []

    def add(self, block: Any) -> None:
        """Verify one manifest entry's block and queue it, or reject it with the reason."""
        name = entry_name(block)
        # NOTE: the first listing stands; a second is reported, neither counted nor rejected
        if name in self.seen:
            self.report.rejected.append({"hash": name, "reason": "it is listed twice in the manifest"})
            return
        try:
            entry = manifest_entry(block)
            self.seen.add(name)
            if entry.parent is not None and entry.parent.hex() in self.rejected:
                raise BlockVerificationError("its parent block was rejected, so it could never be served")
            stored = self._read(entry)
        except (*TAR_ERRORS, BlockVerificationError) as exc:
            self._reject(name, str(exc))
            return
        self.verified.add(name)
        self.batch.append((name, stored))
        if sum(len(s.data or b"") for _, s in self.batch) >= BATCH_BYTES:
            self.flush()

    def _read(self, entry: ManifestEntry) -> Stored:
        member = block_member(entry.block_hash.hex())
        info = check_member(self.tar, member, entry.size, max_blob_bytes(self.spec), BlockVerificationError)
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
        published = self.writer.publish_verified(self.namespace, [s for _, s in kept], self.audit)
        for (name, stored), fresh in zip(kept, published.stored, strict=True):
            if fresh is None:
                self._reject(name, f"cannot be stored: {published.failure}")
            elif fresh:
                self.report.imported += 1
                parent = stored.parent.hex() if stored.parent is not None else None
                self.stored[name] = (parent, stored.block.token_ids)
            else:
                self.report.already_cached += 1
        self.report.awaiting_audit = len(self.stored) if self.audit else 0

    def chains(self) -> list[list[int]]:
        """The token ids of every chain ending at a stored block no other stored block extends,
        from block 0 (parents outside this snapshot read from their verified blobs here)."""
        parents = {parent for parent, _ in self.stored.values()}
        out = []
        for name in self.stored:
            if name in parents:
                continue
            tokens: list[int] = []
            at: str | None = name
            while at is not None:
                parent, ids = self.stored[at] if at in self.stored else self._cached(at)
                tokens[:0] = ids
                at = parent
            out.append(tokens)
        return out

    def _cached(self, block_hex: str) -> tuple[str | None, tuple[int, ...]]:
        """A cached block's parent (hex) and token ids, from its blob."""
        data = self.writer.parts.blobs.read(self.namespace, BlockHash(bytes.fromhex(block_hex)))
        parent = read_header(data).get("parent_hash") or None
        return parent, tuple(read_token_ids(data))

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
