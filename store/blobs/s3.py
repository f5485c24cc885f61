"""The S3 backend of the blob store (``s3://bucket/prefix``): one object per block in any
S3-compatible object store, with the file backend's promises (``store.blobs.base``).

Object key: ``{prefix}/{namespace_hex}/{hash_hex[:2]}/{hash_hex}.safetensors``. A block is
published with a conditional put (``If-None-Match: *``), which the store applies atomically and
never lets replace an existing object: of two writers of the same block the first one's bytes
stay. Objects appear whole or not at all, so there are no temporary objects to collect.

The client comes from ``s3_client()``: endpoint, credentials and region the standard AWS way
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, profiles,
instance roles), short timeouts and one retry, so a dead store degrades to misses within seconds.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from hashing import BlockHash, Namespace
from store.blobs.base import BlobInfo, NotABlob, T, blob_name, parse_blob_name

CONNECT_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 32  # lookups read a prefix's blocks in parallel

# NOTE: 412 is S3's answer to a conditional put on an existing key; 409 (ConditionalRequestConflict)
# to one racing another conditional put of the same key. Either way another writer got there first.
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}


def s3_client(read_timeout_s: float) -> Any:
    """An S3 client (thread-safe) configured from the standard AWS environment, whose calls fail
    after ``CONNECT_TIMEOUT_S`` seconds to connect or ``read_timeout_s`` seconds to answer, with at
    most one retry."""
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=read_timeout_s,
        retries={"mode": "standard", "total_max_attempts": 2},
        max_pool_connections=MAX_CONNECTIONS,
    )
    return boto3.session.Session().client("s3", config=config)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _failure(operation: str, key: str, exc: Exception) -> OSError:
    """An S3 failure as the ``OSError`` the blob-store contract promises: ``FileNotFoundError`` for
    no such object, ``FileExistsError`` for a conditional put that lost, else errno EIO."""
    code = _code(exc) if isinstance(exc, ClientError) else ""
    number = errno.ENOENT if code in _NOT_FOUND else errno.EEXIST if code in _LOST_RACE else errno.EIO
    return OSError(number, f"S3 {operation} failed: {exc}", key)


class S3BlobStore:
    """Objects of blocks under ``s3://{bucket}/{prefix}`` (a ``store.blobs.base.BlobBackend``);
    safe to share between threads (one client) and processes (conditional puts).

    Args:
        bucket: an existing bucket.
        prefix: key prefix of every object ("" for the bucket's root).
        client: a boto3 S3 client, e.g. ``s3_client(...)``.
    """

    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket, self.client = bucket, client
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"

    def check(self) -> None:
        """Raises ``OSError`` when the bucket does not exist or cannot be reached (one HEAD)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise _failure("head_bucket", self.bucket, exc) from exc

    def name(self, namespace: Namespace, block_hash: BlockHash) -> str:
        """Where a block's blob lives, relative to the prefix (what the index records)."""
        return blob_name(namespace, block_hash)

    def write(self, namespace: Namespace, block_hash: BlockHash, data: bytes) -> bool:
        """Put ``data`` as the block's object unless one is already there (conditional put).

        NOTE: unlike the file backend, an existing object's age is not refreshed: S3 cannot touch
        an object without replacing it. A collector that removes it as unindexed just before the
        index entry is published leaves an entry without a blob: a verified miss, then dropped.

        Returns:
            False when an object already existed or another writer's put of it was in flight.

        Raises:
            OSError: the store failed or refused the put (e.g. a store without conditional puts).
        """
        try:
            self._call("put_object", self._key(namespace, block_hash), Body=data, IfNoneMatch="*")
        except FileExistsError:
            return False
        return True

    def read(self, namespace: Namespace, block_hash: BlockHash, max_bytes: int | None = None) -> bytes:
        """The bytes of a block's object, at most ``max_bytes`` of them (None: no bound).

        Raises:
            FileNotFoundError: no such object.
            NotABlob: the object is larger than ``max_bytes`` (decided from the GET's
                ``ContentLength``, its body unread).
            OSError: the store failed or timed out.
        """
        key = self._key(namespace, block_hash)
        response = self._call("get_object", key)
        body, size = response["Body"], int(response.get("ContentLength") or 0)
        try:
            if max_bytes is not None and size > max_bytes:
                body.close()
                raise NotABlob(errno.EFBIG, f"{size} bytes, over the bound of {max_bytes}", key)
            data: bytes = body.read() if max_bytes is None else body.read(max_bytes + 1)
        except BotoCoreError as exc:  # the connection broke or timed out mid-object
            raise _failure("get_object", key, exc) from exc
        if max_bytes is not None and len(data) > max_bytes:
            raise NotABlob(errno.EFBIG, f"over the bound of {max_bytes} bytes", key)
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
        """Whether the block's object exists (one HEAD request).

        Raises:
            OSError: the store failed.
        """
        return self.size(namespace, block_hash) is not None

    def size(self, namespace: Namespace, block_hash: BlockHash) -> int | None:
        """Bytes of the block's object, or None when there is none (one HEAD request).

        Raises:
            OSError: the store failed.
        """
        try:
            return int(self._call("head_object", self._key(namespace, block_hash))["ContentLength"])
        except FileNotFoundError:
            return None

    def delete(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove the block's object; a missing one is not an error.

        Raises:
            OSError: the store failed.
        """
        self._call("delete_object", self._key(namespace, block_hash))

    def scan(self, namespace_hex: str | None = None) -> Iterator[BlobInfo]:
        """Every block object under the prefix, or under one namespace, by listing (1,000 keys a
        request); keys of other shapes are ignored.

        NOTE: ``LastModified`` has whole seconds: an object may look up to 1 s older than it is,
        negligible against the collector's grace period.

        Raises:
            OSError: the store failed.
        """
        listing = self.prefix + (f"{namespace_hex}/" if namespace_hex else "")
        now = time.time()
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=listing)
            for page in pages:
                for obj in page.get("Contents", []):
                    name = str(obj["Key"])[len(self.prefix) :]
                    parsed = parse_blob_name(name)
                    if parsed is None:
                        continue
                    age_s = now - obj["LastModified"].timestamp()
                    yield BlobInfo(name, parsed[0], parsed[1], age_s, int(obj["Size"]))
        except (ClientError, BotoCoreError) as exc:
            raise _failure("list_objects_v2", listing, exc) from exc

    def remove(self, blob: BlobInfo) -> None:
        """Remove what ``scan`` found; a missing one is not an error.

        Raises:
            OSError: the store failed.
        """
        self._call("delete_object", self.prefix + blob.name)

    def used_bytes(self) -> int:
        """Bytes of every block object under the prefix (a full listing).

        Raises:
            OSError: the store failed.
        """
        return sum(b.size for b in self.scan())

    def _key(self, namespace: Namespace, block_hash: BlockHash) -> str:
        return self.prefix + self.name(namespace, block_hash)

    def _call(self, method: str, key: str, **params: Any) -> Any:
        """``client.<method>(Bucket=bucket, Key=key, **params)``'s response; failures as ``_failure``."""
        try:
            return getattr(self.client, method)(Bucket=self.bucket, Key=key, **params)
        except (ClientError, BotoCoreError) as exc:
            raise _failure(method, key, exc) from exc
