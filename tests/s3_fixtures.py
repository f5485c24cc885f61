"""Blob-backend fixtures: a local S3-compatible server (moto's standalone server: real HTTP, the
real boto3 client path), a bucket per test, and ``blob_store``, which runs a test once per backend.
Registered as a plugin in ``tests/conftest.py``.

The helpers at the end reach a backend's objects directly, bypassing the blob-store interface, to
check what is really stored or to damage it as something outside kvproxy would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.blobs.base import BlobBackend
from store.blobs.file import FileBlobStore
from store.blobs.s3 import S3BlobStore, s3_client
from tests.topologies import LocalS3

S3_REGION = "us-east-1"
BACKENDS = ["file", "s3"]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto's S3 server on a free local port for the whole session; yields its endpoint URL."""
    server = LocalS3().start()
    yield server.url
    server.stop()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS variables, pointing at the local server, for boto3 in this process and
    for the processes a test starts; returns the endpoint URL."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": S3_REGION,
        "AWS_DEFAULT_REGION": S3_REGION,
    }.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: str) -> Iterator[str]:
    """A bucket of this test's own; emptied and deleted afterwards."""
    client = s3_client(read_timeout_s=10)
    bucket = f"kvptest-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    yield bucket
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)


@pytest.fixture(params=BACKENDS)
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobBackend:
    """Each blob backend in turn: the directory ``tmp_path/blobs``, then the prefix ``kvp/`` of a
    bucket of this test's own."""
    if request.param == "file":
        return FileBlobStore(tmp_path / "blobs")
    return S3BlobStore(request.getfixturevalue("s3_bucket"), "kvp", s3_client(read_timeout_s=10))


def stored_names(blobs: BlobBackend) -> list[str]:
    """Every object the backend holds, sorted, whatever its name: each file at any depth under a
    directory, each key under a bucket's prefix (names relative to the root)."""
    if isinstance(blobs, FileBlobStore):
        root = blobs.root
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir())
    assert isinstance(blobs, S3BlobStore)
    pages = blobs.client.get_paginator("list_objects_v2").paginate(Bucket=blobs.bucket, Prefix=blobs.prefix)
    return sorted(obj["Key"][len(blobs.prefix) :] for page in pages for obj in page.get("Contents", []))


def read_object(blobs: BlobBackend, name: str) -> bytes:
    """The stored bytes of the object ``name`` (relative to the root)."""
    if isinstance(blobs, FileBlobStore):
        return (blobs.root / name).read_bytes()
    assert isinstance(blobs, S3BlobStore)
    return blobs.client.get_object(Bucket=blobs.bucket, Key=blobs.prefix + name)["Body"].read()


def write_object(blobs: BlobBackend, name: str, data: bytes) -> None:
    """Create or replace the object ``name`` with ``data``, as something outside kvproxy would
    (no create-only condition)."""
    if isinstance(blobs, FileBlobStore):
        path = blobs.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return
    assert isinstance(blobs, S3BlobStore)
    blobs.client.put_object(Bucket=blobs.bucket, Key=blobs.prefix + name, Body=data)
