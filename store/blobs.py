"""The blob store: one safetensors file per block on a local or shared filesystem.

Path: ``{root}/{namespace_hex}/{hash_hex[:2]}/{hash_hex}.safetensors`` (DESIGN.md, "Storage").
Writes go to a temporary file in the same directory, are fsynced, then hard-linked into place,
so a reader (in this or another process) sees either no file or a complete one, and a blob once
placed is never modified: a second writer of the same block keeps the first file.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from hashing import BlockHash, Namespace

BLOB_SUFFIX = ".safetensors"


class BlobStore:
    """Files of blocks under ``root``; safe to share between processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def relative_path(self, namespace: Namespace, block_hash: BlockHash) -> str:
        """Location of a block's blob, relative to ``root`` (what the index records)."""
        h = block_hash.hex()
        return f"{namespace.hex()}/{h[:2]}/{h}{BLOB_SUFFIX}"

    def write(self, relative_path: str, data: bytes) -> bool:
        """Atomically place ``data`` (bytes) at ``relative_path`` unless a blob is already there.

        Returns:
            False when a blob already existed (it is left untouched).

        Raises:
            OSError: the directory is not writable, the disk is full, ...; no partial file is left.
        """
        path = self.root / relative_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # NOTE: link() fails if the target exists, unlike rename(): two processes saving the
            # same block can never swap a file under a reader or change bytes already indexed.
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, relative_path: str) -> bytes:
        """The bytes of a blob.

        Raises:
            OSError: the blob is missing or unreadable.
        """
        return (self.root / relative_path).read_bytes()

    def delete(self, relative_path: str) -> None:
        """Remove a blob; a missing one is not an error."""
        (self.root / relative_path).unlink(missing_ok=True)
