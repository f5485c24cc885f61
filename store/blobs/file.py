"""The file backend of the blob store (``file://``): one safetensors file per block on a local or
shared filesystem.

Path: ``{root}/{namespace_hex}/{hash_hex[:2]}/{hash_hex}.safetensors`` (``store.blobs.base``).
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
from collections.abc import Callable, Iterator
from pathlib import Path

from hashing import BlockHash, Namespace
from store.blobs.base import BlobInfo, NotABlob, T, blob_name, parse_blob_name

TEMP_SUFFIX = ".tmp"


class FileBlobStore:
    """Files of blocks under ``root`` (a ``store.blobs.base.BlobBackend``); safe to share between
    processes (also over NFS-style shared volumes: only create-if-absent links, reads and deletes
    are used)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.url = self.root.absolute().as_uri()

    def name(self, namespace: Namespace, block_hash: BlockHash) -> str:
        """Where a block's blob lives, relative to ``root`` (what the index records)."""
        return blob_name(namespace, block_hash)

    def path(self, namespace: Namespace, block_hash: BlockHash) -> Path:
        """The file of a block's blob."""
        return self.root / self.name(namespace, block_hash)

    def write(self, namespace: Namespace, block_hash: BlockHash, data: bytes) -> bool:
        """Atomically place ``data`` as the block's blob unless one is already there.

        Returns:
            False when a blob already existed (it is left untouched).

        Raises:
            OSError: the directory is not writable, the disk is full, ...; no partial file is left.
        """
        path = self.path(namespace, block_hash)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            for attempt in (1, 2):  # the garbage collector may remove an empty directory meanwhile
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except (FileExistsError, NotADirectoryError):
                    self._clear_parents(path)  # a file stands where a directory of ours belongs
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

    def read(self, namespace: Namespace, block_hash: BlockHash, max_bytes: int | None = None) -> bytes:
        """The bytes of a block's blob, at most ``max_bytes`` of them (None: no bound).

        NOTE: what stands at the path decides whose fault a failure is, never the errno alone:
        only a regular file is read (opened without following a link: blobs are never links; a
        FIFO or device would block the engine forever, a directory or socket would never heal),
        and a file larger than ``max_bytes`` is refused from its size, unread.

        Raises:
            FileNotFoundError: nothing stands there (also when a directory above it is gone or
                is no directory).
            NotABlob: something else than a regular file stands in its place (a link, a socket,
                a device, a directory, a FIFO), a file we own that we may not read, or a file
                over ``max_bytes``.
            OSError: a regular file that cannot be read (EIO, a stale NFS handle): kept.
        """
        path = self.path(namespace, block_hash)
        try:
            # NOTE: O_NONBLOCK opens a FIFO at once instead of waiting for a writer
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise _fault(path, exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotABlob(errno.EINVAL, "not a regular file", str(path))
            if max_bytes is not None and st.st_size > max_bytes:
                raise NotABlob(errno.EFBIG, f"{st.st_size} bytes, over the bound of {max_bytes}", str(path))
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as f:
            try:
                data = f.read(-1 if max_bytes is None else max_bytes + 1)
            except OSError as exc:
                raise _fault(path, exc) from exc
        if max_bytes is not None and len(data) > max_bytes:  # it grew since fstat
            raise NotABlob(errno.EFBIG, f"over the bound of {max_bytes} bytes", str(path))
        return data

    def read_checked(
        self,
        namespace: Namespace,
        block_hash: BlockHash,
        check: Callable[[bytes], T],
        max_bytes: int | None = None,
    ) -> T:
        """``check`` of the block's blob (``BlobBackend.read_checked``; one copy: raises what
        ``read`` or ``check`` raises)."""
        return check(self.read(namespace, block_hash, max_bytes))

    def exists(self, namespace: Namespace, block_hash: BlockHash) -> bool:
        """Whether something stands where the block's blob belongs."""
        return os.path.lexists(self.path(namespace, block_hash))

    def size(self, namespace: Namespace, block_hash: BlockHash) -> int | None:
        """Bytes of the block's blob, or None when there is none."""
        try:
            return self.path(namespace, block_hash).lstat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def delete(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove a block's blob (whatever stands in its place); a missing one is not an error."""
        self._remove(self.path(namespace, block_hash))

    def scan(self, namespace_hex: str | None = None) -> Iterator[BlobInfo]:
        """Every blob and temporary file under the root, or under one namespace (a file vanishing
        meanwhile is skipped)."""
        now = time.time()
        for path in self.root.glob(f"{namespace_hex or '*'}/*/*"):
            try:
                st = path.lstat()  # NOTE: never follows a link (one to itself would raise ELOOP)
            except FileNotFoundError:
                continue
            name = path.relative_to(self.root).as_posix()
            parsed = parse_blob_name(name)
            if parsed is not None:
                block_hash: BlockHash | None = parsed[1]
            elif path.name.endswith(TEMP_SUFFIX):
                block_hash = None
            else:
                continue  # not a name we write
            yield BlobInfo(name, path.parent.parent.name, block_hash, now - st.st_mtime, st.st_size)

    def remove(self, blob: BlobInfo) -> None:
        """Remove what ``scan`` found."""
        self._remove(self.root / blob.name)

    def check(self) -> None:
        """Nothing to reach: the directory is made on the first write."""

    def used_bytes(self) -> int:
        """Bytes of every object under the root."""
        return sum(f.size for f in self.scan())

    def _remove(self, path: Path) -> None:
        """Remove a file (or whatever stands in its place), then the directories it leaves empty
        (never the root; a writer that loses its directory meanwhile makes it again)."""
        self._clear_parents(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        for directory in (path.parent, path.parent.parent):
            if directory == self.root:
                break
            try:
                directory.rmdir()
            except OSError:
                break  # not empty, or gone

    def _clear_parents(self, path: Path) -> None:
        """Remove what stands in the place of a directory above ``path`` (below the root) and is
        no directory (a file, a socket, a dangling link), so the blob can be stored again."""
        for directory in (path.parent.parent, path.parent):
            if directory == self.root or directory.is_dir():
                continue
            if os.path.lexists(directory):
                directory.unlink(missing_ok=True)
            break


def _fault(path: Path, exc: OSError) -> OSError:
    """Whose fault a failed open or read of ``path`` is, from what stands there now (``lstat``):
    ``FileNotFoundError`` when nothing does (also ENOTDIR: a directory above it is no directory),
    ``NotABlob`` when it is no regular file or a file of ours we may not read, else ``exc`` (a file
    that cannot be read: the disk's fault, kept)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return FileNotFoundError(errno.ENOENT, "no blob", str(path))
    except OSError as again:
        if again.errno == errno.ELOOP:  # a link above it (lstat never follows the last part)
            return FileNotFoundError(errno.ENOENT, "no blob (a looping link above it)", str(path))
        return exc  # the path itself cannot be looked at (a stale handle, a dead mount)
    if not stat.S_ISREG(st.st_mode):
        return NotABlob(errno.EINVAL, f"not a regular file ({exc.strerror})", str(path))
    if exc.errno in (errno.EACCES, errno.EPERM) and st.st_uid == os.geteuid():
        return NotABlob(exc.errno, "a file of ours we may not read", str(path))
    return exc
