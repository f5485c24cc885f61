"""The blob store: one safetensors file per block on a local or shared filesystem.

Path: ``{root}/{namespace_hex}/{hash_hex[:2]}/{hash_hex}.safetensors`` (docs/design.md, "Storage").
Writes go to a temporary file in the same directory, are fsynced, then hard-linked into place,
so a reader (in this or another process) sees either no file or a complete one, and a blob once
placed is never modified: a second writer of the same block keeps the first file.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hashing import BlockHash, Namespace

BLOB_SUFFIX = ".safetensors"
TEMP_SUFFIX = ".tmp"


def _open_nonblocking(path: str, flags: int) -> int:
    # O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer.
    return os.open(path, flags | os.O_NONBLOCK)


@dataclass(frozen=True)
class BlobFile:
    """A file found under the blob root: a blob (``member`` set) or a writer's temporary file."""

    path: Path
    member: str | None  # ``{namespace_hex}:b:{hash_hex}`` for a blob
    age_s: float  # seconds since last modified
    size: int  # bytes


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
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            for attempt in (1, 2):  # the garbage collector may remove an empty directory meanwhile
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            # NOTE: link() fails if the target exists, unlike rename(): two processes saving the
            # same block can never swap a file under a reader or change bytes already indexed.
            os.link(tmp, path)
            return True
        except FileExistsError:
            # NOTE: a fresh mtime tells the garbage collector the blob is wanted again.
            os.utime(path)
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, relative_path: str) -> bytes:
        """The bytes of a blob.

        NOTE: only a regular file is read: a FIFO or device put in a blob's place would block the
        engine forever, a directory would never heal.

        Raises:
            OSError: the blob is missing, unreadable or not a regular file.
        """
        path = self.root / relative_path
        with open(path, "rb", opener=_open_nonblocking) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            return f.read()

    def delete(self, relative_path: str) -> None:
        """Remove a blob (whatever stands in its place); a missing one is not an error."""
        path = self.root / relative_path
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def scan(self) -> Iterator[BlobFile]:
        """Every blob and temporary file under the root (a file vanishing meanwhile is skipped)."""
        now = time.time()
        for path in self.root.glob("*/*/*"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if path.name.endswith(BLOB_SUFFIX) and not path.name.startswith("."):
                member = f"{path.parent.parent.name}:b:{path.name.removesuffix(BLOB_SUFFIX)}"
            elif path.name.endswith(TEMP_SUFFIX):
                member = None
            else:
                continue
            yield BlobFile(path, member, now - st.st_mtime, st.st_size)

    def remove_empty_dirs(self) -> None:
        """Remove empty directories under the root (never the root itself)."""
        for directory in sorted(self.root.glob("*/*"), reverse=True) + sorted(self.root.glob("*")):
            try:
                directory.rmdir()
            except OSError:
                pass  # not empty, not a directory, or gone

    def used_bytes(self) -> int:
        """Bytes of every file under the root."""
        return sum(f.size for f in self.scan())
