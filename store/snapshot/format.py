"""The snapshot format: a namespace's blocks, as stored, in one tar archive with a manifest.

Archive layout (``SNAPSHOT_VERSION`` 1; tar, uncompressed: blocks do not compress)::

    blocks/{hash_hex}.safetensors   each block's blob, byte for byte as the blob store holds it
    manifest.json                   written last: {"kind", "snapshot_version", "created", "model"
                                    (a name only), the identity (``NamespaceIdentity.manifest``:
                                    model_fingerprint, kv_dtype, weights, device, block_size,
                                    block_format_version, tenant, namespace), "blocks":
                                    [{"hash", "parent", "index", "tokens", "bytes", "xxh3_128"}]}

Here: the manifest's checks (``read_manifest``, ``manifest_entry``) and a block's
(``verify``), shared by the export (``store.snapshot.export``) and the import
(``store.snapshot.importer``). Every check is pure: it reads bytes and raises.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from typing import Any, NamedTuple

from hashing import BLOCK_SIZE, BlockHash, Namespace, chain_hash
from store.interface import KVBlock, KVSpec
from store.serde import BlockVerificationError, decode_block, read_token_ids

KIND = "kvproxy-cache-snapshot"
SNAPSHOT_VERSION = 1
MANIFEST = "manifest.json"
TAR_ERRORS = (tarfile.TarError, ValueError, OverflowError, EOFError)
"""What Python's tarfile raises for a malformed archive (bad PAX sparse headers: ``ValueError``)."""
_HEX32 = re.compile(r"[0-9a-f]{32}")


class SnapshotError(ValueError):
    """The archive cannot be imported here; the message says why."""


class SnapshotMismatch(SnapshotError):
    """The snapshot was made by another model, format or layout; the message names the field."""


class ManifestEntry(NamedTuple):
    """One block as the manifest lists it, checked (``manifest_entry``)."""

    block_hash: BlockHash
    parent: BlockHash | None
    position: int
    digest: str  # xxh3_128 hex of the blob's bytes
    size: int  # bytes


def block_member(block_hash_hex: str) -> str:
    """The archive name of a block's blob."""
    return f"blocks/{block_hash_hex}.safetensors"


def verify(
    data: bytes,
    namespace: Namespace,
    spec: KVSpec,
    block_hash: BlockHash,
    parent: BlockHash | None,
    index: int,
) -> KVBlock:
    """Check a blob is block ``index`` of ``namespace`` named ``block_hash`` after ``parent``:
    its hash is the chain hash of its own tokens, and ``serde.decode_block`` accepts it.

    Returns:
        The block, decoded.

    Raises:
        BlockVerificationError: any mismatch or unreadable data.
    """
    token_ids = read_token_ids(data)
    if len(token_ids) != BLOCK_SIZE or chain_hash(parent or namespace, token_ids) != block_hash:
        raise BlockVerificationError("the block's hash does not match its parent and token ids")
    return decode_block(
        data,
        index=index,
        block_hash=block_hash,
        parent=parent,
        namespace=namespace,
        token_ids=token_ids,
        spec=spec,
    )


def read_manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    """The archive's manifest, of the right kind and version, naming a tenant and listing blocks.

    Raises:
        SnapshotError: no readable manifest, another kind or version of archive, no tenant, or
            a ``blocks`` that is not a list.
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
    if not isinstance(manifest.get("tenant"), str):
        raise SnapshotError("not a kvproxy snapshot: the manifest names no tenant")
    if not isinstance(manifest.get("blocks"), list):
        raise SnapshotError("not a kvproxy snapshot: the manifest's `blocks` is not a list")
    return manifest


def manifest_entry(block: Any) -> ManifestEntry:
    """One block's manifest entry, checked.

    Raises:
        BlockVerificationError: naming the field that is missing or malformed.
    """
    if not isinstance(block, dict):
        raise BlockVerificationError("its manifest entry is not an object")
    hashes = [block.get("hash"), block.get("parent") or "0" * 32]
    if not all(isinstance(h, str) and _HEX32.fullmatch(h) for h in hashes):
        raise BlockVerificationError("its manifest entry's `hash` or `parent` is not 32 hex digits")
    position, digest, size = block.get("index"), block.get("xxh3_128"), block.get("bytes")
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        raise BlockVerificationError("its manifest entry's `index` is not a block position")
    if not isinstance(digest, str):
        raise BlockVerificationError("its manifest entry has no `xxh3_128` digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BlockVerificationError("its manifest entry's `bytes` is not a size")
    parent = BlockHash(bytes.fromhex(block["parent"])) if block.get("parent") else None
    return ManifestEntry(BlockHash(bytes.fromhex(block["hash"])), parent, position, digest, size)


def check_member(
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
    if info.size > limit:
        raise error(f"{name} declares {info.size} bytes, more than the {limit} it may hold")
    if size is not None and info.size != size:
        raise error(f"{name} declares {info.size} bytes, not the manifest's {size}")
    return info


def entry_name(block: Any) -> str:
    """How a manifest entry is named in reports: its hash, or what it is when it has none."""
    return str(block.get("hash")) if isinstance(block, dict) else repr(block)


def depth(block: Any) -> int:
    """A manifest entry's block index, for ordering parents first (malformed entries first)."""
    position = block.get("index") if isinstance(block, dict) else None
    return position if isinstance(position, int) else -1


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Append a file ``name`` holding ``data`` to an archive being written."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))


def load_members(tar: tarfile.TarFile) -> None:
    """Read every member's header (nothing of their data).

    Raises:
        SnapshotError: the archive is cut short, naming the member whose declared bytes it lacks.
    """
    last = None
    try:
        while (member := tar.next()) is not None:
            last = member
    except TAR_ERRORS as exc:
        where = f"{last.name} declares {last.size} bytes the archive does not hold" if last else str(exc)
        raise SnapshotError(f"not a readable snapshot: {where}") from exc


def check_sizes(tar: tarfile.TarFile, blocks: list[Any], limit: int) -> None:
    """Every block member the manifest lists, checked before any is read: a plain file of the
    size the manifest gives, at most ``limit`` bytes (a block's largest blob).

    Raises:
        SnapshotError: naming the first member that is not.
    """
    present = set(tar.getnames())
    for block in blocks:
        name = block_member(entry_name(block))
        if name in present:
            size = block.get("bytes")
            check_member(tar, name, size if isinstance(size, int) else None, limit, SnapshotError)
