"""A local-disk tier in front of a remote blob store (``--blob-disk-cache`` before an ``s3://``
``--blob-url``), so a hit after a restart reads the disk instead of paying object-storage latency.

Reads come from a local ``FileBlobStore`` directory when it holds the blob, else from the remote,
whose bytes are then copied into the directory; writes go to the remote, the source of truth, and
are copied too. The directory is a cache with its own byte budget: beyond it, the least recently
read blobs are deleted. Recency lives in an in-process LRU of sizes with a running total, seeded at
start by one scan of the directory (oldest first; a hit refreshes a file's mtime, so the order
survives a restart); no read ever scans the directory.

A local fault (a full or read-only disk, a file gone or unreadable) is logged and degrades to the
remote: it never fails a call. A local copy is unverified like any blob: ``read_checked`` runs the
caller's verification on it, and a copy that fails is dropped alone and the remote's object
checked on its own (copied once it passes), so a damaged disk never costs the bucket a good
object; ``delete`` (a block the caller drops: its remote object failed too) removes both.

NOTE: a directory belongs to one server: the budget counts only what this process copied or found
at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator

from hashing import BlockHash, Namespace
from store.blobs.base import BlobBackend, BlobInfo, T, blob_name, parse_blob_name
from store.blobs.file import FileBlobStore

log = logging.getLogger(__name__)


class TieredBlobStore:
    """A ``store.blobs.base.BlobBackend``: ``remote``'s blobs, read through the directory ``local``,
    which holds at most ``budget_bytes`` bytes of copies; safe to share between threads.

    Only ``read``, ``read_checked`` and ``write`` use the local copies; ``exists``, ``size``,
    ``scan``, ``used_bytes``, ``check`` and ``url`` are the remote's (the truth); ``delete`` and
    ``remove`` act on both.
    Constructing it scans ``local`` once (temporary files a killed writer left are removed).
    """

    def __init__(self, remote: BlobBackend, local: FileBlobStore, budget_bytes: int) -> None:
        self.remote, self.local, self.budget_bytes = remote, local, budget_bytes
        self.url = remote.url
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # name -> bytes, least recently read first
        self._used = 0  # bytes, the sum of _sizes
        self._faulty = False  # NOTE: a full disk fails every copy: warn once until one succeeds
        try:
            for blob in sorted(local.scan(), key=lambda b: b.age_s, reverse=True):
                if blob.block_hash is None:
                    local.remove(blob)
                else:
                    self._sizes[blob.name] = blob.size
                    self._used += blob.size
        except OSError as exc:
            self._fault("scan", exc)
        self._trim()
        log.info(
            "disk tier %s in front of %s: %d blobs, %.1f MB of %.1f MB (--blob-disk-cache-bytes)",
            local.url,
            remote.url,
            len(self._sizes),
            self._used / 1e6,
            budget_bytes / 1e6,
        )

    @property
    def local_bytes(self) -> int:
        """Bytes of the copies the local tier holds (as counted, not measured)."""
        return self._used

    def name(self, namespace: Namespace, block_hash: BlockHash) -> str:
        """Where a block's blob lives, relative to the root (``blob_name``, the same in both tiers)."""
        return blob_name(namespace, block_hash)

    def read(self, namespace: Namespace, block_hash: BlockHash, max_bytes: int | None = None) -> bytes:
        """The bytes of a block's blob: the local copy when there is one, else the remote's (then
        copied locally, within the budget).

        Raises:
            OSError: the remote's error, when there is no usable local copy.
        """
        data = self._copy(namespace, block_hash, max_bytes)
        if data is not None:
            return data
        data = self.remote.read(namespace, block_hash, max_bytes)
        self._keep(namespace, block_hash, data)
        return data

    def read_checked(
        self,
        namespace: Namespace,
        block_hash: BlockHash,
        check: Callable[[bytes], T],
        max_bytes: int | None = None,
    ) -> T:
        """``check`` of the local copy's bytes; when there is none or ``check`` rejects it (the
        copy is then dropped, with a warning), of the remote's, copied locally once they pass.

        NOTE: a damaged copy is the disk's fault, not the bucket's: the remote's object is checked
        on its own, and only when it fails too does the caller drop the block (``delete``, both).

        Raises:
            OSError: the remote's error, when there is no good local copy.
            Exception: what ``check`` raised on the remote's bytes.
        """
        data = self._copy(namespace, block_hash, max_bytes)
        if data is not None:
            try:
                return check(data)
            except Exception as exc:  # the caller's verification, whatever it raises
                log.warning(
                    "disk tier: the copy of %s is damaged (%s): dropped, reading %s",
                    blob_name(namespace, block_hash),
                    exc,
                    self.url,
                )
                self._drop(namespace, block_hash)
        data = self.remote.read(namespace, block_hash, max_bytes)
        checked = check(data)
        self._keep(namespace, block_hash, data)
        return checked

    def _copy(self, namespace: Namespace, block_hash: BlockHash, max_bytes: int | None) -> bytes | None:
        """The local copy's bytes, or None when there is none or it is unusable (then dropped)."""
        name = blob_name(namespace, block_hash)
        with self._lock:
            held = self._sizes.get(name)
            if held is not None:
                self._sizes.move_to_end(name)
        if held is None:
            return None
        try:
            data = self.local.read(namespace, block_hash, max_bytes)
            if len(data) == held:
                with contextlib.suppress(OSError):  # the order after a restart; not worth a fault
                    os.utime(self.local.path(namespace, block_hash))
                return data
            # NOTE: a copy of the wrong size is damaged: read the remote rather than fail the
            # caller's verification, which would then drop the block.
            log.warning("disk tier: %s has %d bytes, not %d: reading %s", name, len(data), held, self.url)
        except OSError as exc:
            self._fault("read", exc)
        self._drop(namespace, block_hash)
        return None

    def write(self, namespace: Namespace, block_hash: BlockHash, data: bytes) -> bool:
        """Place ``data`` as the block's blob in the remote (create-only) and, when this call placed
        it, a copy locally (best effort, within the budget).

        NOTE: no copy when the remote already had a blob: it holds another writer's bytes, which
        the next read copies. A copy left from before the remote placed it (an object another
        server's collector removed) is replaced by the bytes the remote now holds.

        Returns:
            The remote's answer: True when this call placed the blob, False when one existed.

        Raises:
            OSError: the remote failed (nothing is copied).
        """
        placed = self.remote.write(namespace, block_hash, data)
        if placed:
            self._drop(namespace, block_hash)
            self._keep(namespace, block_hash, data)
        return placed

    def exists(self, namespace: Namespace, block_hash: BlockHash) -> bool:
        """Whether the remote holds the block's blob. Raises ``OSError``: the remote failed."""
        return self.remote.exists(namespace, block_hash)

    def size(self, namespace: Namespace, block_hash: BlockHash) -> int | None:
        """Bytes of the remote's blob, or None. Raises ``OSError``: the remote failed."""
        return self.remote.size(namespace, block_hash)

    def delete(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove the block's blob from both tiers: the local copy first, so a damaged one is never
        served again even when the remote fails.

        Raises:
            OSError: the remote failed (a local fault is only logged).
        """
        self._drop(namespace, block_hash)
        self.remote.delete(namespace, block_hash)

    def scan(self, namespace_hex: str | None = None) -> Iterator[BlobInfo]:
        """The remote's objects (``BlobBackend.scan``). Raises ``OSError``: the remote failed."""
        return self.remote.scan(namespace_hex)

    def remove(self, blob: BlobInfo) -> None:
        """Remove what ``scan`` found from both tiers.

        Raises:
            OSError: the remote failed (a local fault is only logged).
        """
        self._forget(blob.name)
        try:
            self.local.remove(blob)
        except OSError as exc:
            self._fault("remove", exc)
        self.remote.remove(blob)

    def check(self) -> None:
        """Raises ``OSError`` when the remote cannot be reached (the local tier needs nothing)."""
        self.remote.check()

    def used_bytes(self) -> int:
        """Bytes of every object in the remote. Raises ``OSError``: the remote failed."""
        return self.remote.used_bytes()

    def _keep(self, namespace: Namespace, block_hash: BlockHash, data: bytes) -> None:
        """Copy a blob into the local tier (create-only, atomic), then trim the tier to its budget;
        a fault is logged, never raised."""
        if len(data) > self.budget_bytes:
            return
        try:
            placed = self.local.write(namespace, block_hash, data)
            size = len(data) if placed else self.local.size(namespace, block_hash)
        except OSError as exc:
            self._fault("copy", exc)
            return
        self._faulty = False
        if size is None:
            return  # removed meanwhile (another thread's delete)
        name = blob_name(namespace, block_hash)
        with self._lock:
            self._used += size - self._sizes.get(name, 0)
            self._sizes[name] = size
            self._sizes.move_to_end(name)
        self._trim()

    def _trim(self) -> None:
        """Delete the least recently read copies while the tier holds more than its budget."""
        victims: list[tuple[str, int]] = []
        with self._lock:
            while self._used > self.budget_bytes and self._sizes:
                name, size = self._sizes.popitem(last=False)
                self._used -= size
                victims.append((name, size))
        for name, size in victims:
            parsed = parse_blob_name(name)
            assert parsed is not None, name  # only names blob_name makes are held
            try:
                self.local.remove(BlobInfo(name, parsed[0], parsed[1], 0.0, size))
            except OSError as exc:
                self._fault("trim", exc)

    def _drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Forget and remove the block's local copy; a fault is logged, never raised."""
        self._forget(blob_name(namespace, block_hash))
        try:
            self.local.delete(namespace, block_hash)
        except OSError as exc:
            self._fault("delete", exc)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._used -= self._sizes.pop(name, 0)

    def _fault(self, operation: str, exc: OSError) -> None:
        """Log a local-tier fault: a warning, or a debug line while copies keep failing."""
        level = logging.DEBUG if self._faulty else logging.WARNING
        self._faulty = True
        log.log(level, "disk tier %s: %s failed (%s); using %s", self.local.url, operation, exc, self.url)
