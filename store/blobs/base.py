"""The blob-store interface: where block blobs live, whatever holds them.

Every blob access of the cache (lookup, writer, garbage collector, clear) goes through a
``BlobBackend``, by block name; nothing else builds a path or an object key. Two backends
implement it: ``store.blobs.file.FileBlobStore`` (a local or shared directory, ``file://``) and
``store.blobs.s3.S3BlobStore`` (an S3-compatible bucket, ``s3://``). Both name a block's blob
``{namespace_hex}/{hash_hex[:2]}/{hash_hex}.safetensors`` (docs/design.md, "Storage"), relative
to their root, and both keep the same promises:

- **create-only**: a blob once placed is never replaced or modified; a second writer of the same
  block keeps the first one's bytes;
- **atomic**: a reader (in this or another process) sees either no blob or a complete one, so the
  index entry, written only after ``write`` returns, never points at a partial blob;
- **verified by the caller**: ``read_checked`` hands a blob's bytes to the caller's check; a
  backend with copies removes only a copy that fails it;
- **faults are ``OSError``**: an unreachable, full or read-only store raises ``OSError`` (never
  a backend-specific error), which the cache turns into a miss or a skipped save. Only a blob that
  is gone (``FileNotFoundError``) or is no blob (``NotABlob``) is the blob's fault, and dropped
  with its index entry; any other fault leaves both for the next read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hashing import BlockHash, Namespace

BLOB_SUFFIX = ".safetensors"
T = TypeVar("T")


class NotABlob(OSError):
    """What stands in a blob's place is no blob (a link, a socket, a directory, a FIFO, a device,
    a file of ours we may not read, or one larger than any blob can be): damaged, as a blob that
    fails verification is."""


@dataclass(frozen=True)
class BlobInfo:
    """A stored object found by ``scan``: a block's blob (``block_hash`` set) or a writer's
    leftover temporary file (``block_hash`` None; only the file backend has them)."""

    name: str  # the object's name relative to the root
    namespace_hex: str
    block_hash: BlockHash | None
    age_s: float  # seconds since last modified
    size: int  # bytes


def blob_name(namespace: Namespace, block_hash: BlockHash) -> str:
    """Where a block's blob lives relative to a backend's root (what the index records)."""
    h = block_hash.hex()
    return f"{namespace.hex()}/{h[:2]}/{h}{BLOB_SUFFIX}"


def parse_blob_name(name: str) -> tuple[str, BlockHash] | None:
    """``(namespace_hex, block_hash)`` of a name ``blob_name`` made, or None for any other name
    (a hidden file, another suffix, a name that is not hex)."""
    parts = name.split("/")
    if len(parts) != 3 or not parts[2].endswith(BLOB_SUFFIX) or parts[2].startswith("."):
        return None
    try:
        return parts[0], BlockHash(bytes.fromhex(parts[2].removesuffix(BLOB_SUFFIX)))
    except ValueError:
        return None


class BlobBackend(Protocol):
    """Blobs of blocks, by name; safe to share between threads and processes.

    Every method that touches storage raises ``OSError`` when the storage fails (unreachable,
    full, read-only, timed out); "not there" is never an error except for ``read``.
    """

    @property
    def url(self) -> str:
        """Where the blobs live, for messages: ``file:///path`` or ``s3://bucket/prefix``."""
        ...

    def name(self, namespace: Namespace, block_hash: BlockHash) -> str:
        """Where a block's blob lives, relative to the root (``blob_name``)."""
        ...

    def write(self, namespace: Namespace, block_hash: BlockHash, data: bytes) -> bool:
        """Place ``data`` as the block's blob, atomically, unless one is already there.

        Returns:
            True when this call placed it; False when a blob already existed (left untouched).

        Raises:
            OSError: the store failed; no partial blob is left.
        """
        ...

    def read(self, namespace: Namespace, block_hash: BlockHash, max_bytes: int | None = None) -> bytes:
        """The bytes of a block's blob (unverified: the caller verifies them), at most
        ``max_bytes`` (None: no bound; ``store.serde.read_bound``).

        Raises:
            FileNotFoundError: the blob is missing.
            NotABlob: what stands in its place is no blob, or is over ``max_bytes`` (decided
                from its size, unread).
            OSError: it cannot be read, or the store failed.
        """
        ...

    def read_checked(
        self,
        namespace: Namespace,
        block_hash: BlockHash,
        check: Callable[[bytes], T],
        max_bytes: int | None = None,
    ) -> T:
        """``check`` (the caller's verification) of the bytes of a block's blob (at most
        ``max_bytes``, as ``read``).

        A backend holding several copies (the disk tier in front of a bucket) drops a copy that
        ``check`` rejects, and checks the next on its own: only a damaged copy is ever removed.

        Raises:
            OSError: the blob is missing or unreadable, or the store failed.
            Exception: what ``check`` raised on the last copy (the source of truth's), which
                the caller then drops with ``delete``.
        """
        ...

    def exists(self, namespace: Namespace, block_hash: BlockHash) -> bool:
        """Whether something stands where the block's blob belongs.

        Raises:
            OSError: the store failed (a failure is never reported as "absent").
        """
        ...

    def size(self, namespace: Namespace, block_hash: BlockHash) -> int | None:
        """Bytes of the block's blob, or None when there is none.

        Raises:
            OSError: the store failed.
        """
        ...

    def delete(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove a block's blob; a missing one is not an error.

        Raises:
            OSError: the store failed.
        """
        ...

    def scan(self, namespace_hex: str | None = None) -> Iterator[BlobInfo]:
        """Every stored object under the root, or under one namespace, in no particular order
        (an object vanishing meanwhile is skipped; names the backend never writes are ignored).

        Raises:
            OSError: the store failed (possibly after some objects were yielded).
        """
        ...

    def remove(self, blob: BlobInfo) -> None:
        """Remove what ``scan`` found; a missing one is not an error.

        Raises:
            OSError: the store failed.
        """
        ...

    def check(self) -> None:
        """Raises ``OSError`` when the store cannot be reached at all (checked once at start, to
        warn early; a directory is made on first write, so only a bucket can fail here)."""
        ...

    def used_bytes(self) -> int:
        """Bytes of every object under the root (one full ``scan``).

        Raises:
            OSError: the store failed.
        """
        ...
