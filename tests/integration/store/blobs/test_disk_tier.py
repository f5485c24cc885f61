"""The disk tier in front of S3 (``--blob-disk-cache``; moto's S3 over HTTP, real files): a read is
paid to the bucket once, then served from disk, also by the next process; the disk stays within its
budget, least recently read first; a disk fault degrades to the bucket; a damaged copy is dropped
alone, the bucket's object checked on its own (both go with ``delete``); and a server restarted
on the same disk serves its hits from it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from hashing import BlockHash, Namespace, block_hashes
from proxy.config import Settings
from store.blobs.file import FileBlobStore
from store.blobs.s3 import S3BlobStore, s3_client
from store.blobs.tiered import TieredBlobStore
from store.serde import read_token_ids
from tests.api import Api
from tests.helpers import random_tokens
from tests.s3_fixtures import read_object, stored_names, write_object

NS = Namespace(b"\x01" * 16)
BLOB = b"k" * 1000  # bytes


def block(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(16, "big"))


class CountedS3(S3BlobStore):
    """The real S3 backend whose client counts the requests it sends, by operation (a boto3 event
    hook: every request still goes to the server)."""

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket, "kvp", s3_client(read_timeout_s=10))
        self.requests: Counter[str] = Counter()
        self.client.meta.events.register("before-call.s3.*", self._count)

    def _count(self, model, **_kwargs) -> None:
        self.requests[model.name] += 1


@pytest.fixture
def remote(s3_bucket) -> CountedS3:
    return CountedS3(s3_bucket)


@pytest.fixture
def bucket(s3_bucket) -> S3BlobStore:
    """The same objects through a client of their own (uncounted), for inspecting."""
    return S3BlobStore(s3_bucket, "kvp", s3_client(read_timeout_s=10))


@pytest.fixture
def disk(tmp_path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "disk")


def on_disk(disk: FileBlobStore) -> dict[str, int]:
    """Every file under the disk tier's directory, with its size in bytes."""
    return {
        p.relative_to(disk.root).as_posix(): p.stat().st_size for p in disk.root.rglob("*") if p.is_file()
    }


def test_a_second_read_is_served_from_disk_also_after_a_restart(remote, disk):
    """The first read GETs the object and copies it; the next, and a new process's on the same
    directory, send the bucket nothing."""
    remote.write(NS, block(1), BLOB)
    tier = TieredBlobStore(remote, disk, budget_bytes=10_000)
    assert tier.read(NS, block(1)) == BLOB and remote.requests["GetObject"] == 1
    assert on_disk(disk) == {remote.name(NS, block(1)): len(BLOB)}
    assert tier.read(NS, block(1)) == BLOB and remote.requests["GetObject"] == 1
    restarted = TieredBlobStore(remote, disk, budget_bytes=10_000)
    assert restarted.read(NS, block(1)) == BLOB and remote.requests["GetObject"] == 1


def test_writes_go_to_both_and_the_bucket_stays_the_truth(remote, bucket, disk):
    """A write puts the object and copies it (the next read sends nothing); a block already in
    the bucket is left alone and not copied; exists, size and scan are the bucket's; a stale copy
    of a block the bucket lacks is replaced by the write that puts it."""
    tier = TieredBlobStore(remote, disk, budget_bytes=10_000)
    assert tier.write(NS, block(1), BLOB) is True
    assert read_object(bucket, remote.name(NS, block(1))) == BLOB
    assert on_disk(disk) == {remote.name(NS, block(1)): len(BLOB)}
    remote.write(NS, block(2), b"theirs")
    assert tier.write(NS, block(2), b"mine") is False
    assert list(on_disk(disk)) == [remote.name(NS, block(1))]
    assert tier.read(NS, block(2)) == b"theirs" and tier.read(NS, block(1)) == BLOB
    assert remote.requests["GetObject"] == 1  # block 2's, once
    disk.write(NS, block(3), BLOB)  # a file the bucket has not: never reported
    assert (tier.exists(NS, block(3)), tier.size(NS, block(3)), tier.size(NS, block(1))) == (
        False,
        None,
        1000,
    )
    assert sorted(b.name for b in tier.scan()) == stored_names(remote)
    assert tier.write(NS, block(3), b"fresh") is True and disk.read(NS, block(3)) == b"fresh"  # replaced


def test_the_disk_stays_within_its_budget_least_recently_read_first(remote, disk):
    """Budget 3,000 bytes, blobs of 1,000: reading blocks 1, 2, 3, then 1 again, then 4 deletes
    block 2's copy (the least recently read), not block 1's; an object over the whole budget is
    never copied."""
    for i in (1, 2, 3, 4):
        remote.write(NS, block(i), BLOB)
    tier = TieredBlobStore(remote, disk, budget_bytes=3000)
    for i in (1, 2, 3, 1, 4):
        tier.read(NS, block(i))
    assert sorted(on_disk(disk)) == sorted(remote.name(NS, block(i)) for i in (1, 3, 4))
    assert tier.local_bytes == sum(on_disk(disk).values()) == 3000
    remote.write(NS, block(5), b"x" * 3001)
    assert tier.read(NS, block(5)) == b"x" * 3001 and tier.local_bytes == 3000
    assert remote.name(NS, block(5)) not in on_disk(disk)
    assert TieredBlobStore(remote, disk, budget_bytes=1000).local_bytes == 1000  # trimmed at start


def test_a_disk_fault_degrades_to_the_bucket(remote, bucket, disk, tmp_path):
    """The directory removed: the read goes to the bucket and copies again. The directory's place
    taken by a file (nothing can be written): reads and writes still succeed, from the bucket."""
    remote.write(NS, block(1), BLOB)
    tier = TieredBlobStore(remote, disk, budget_bytes=10_000)
    tier.read(NS, block(1))
    for path in sorted(disk.root.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    disk.root.rmdir()
    assert tier.read(NS, block(1)) == BLOB and remote.requests["GetObject"] == 2
    assert list(on_disk(disk)) == [remote.name(NS, block(1))]

    blocked = FileBlobStore(tmp_path / "not-a-directory")
    blocked.root.write_bytes(b"")
    tier = TieredBlobStore(remote, blocked, budget_bytes=10_000)
    assert tier.read(NS, block(1)) == BLOB and tier.read(NS, block(1)) == BLOB
    assert tier.write(NS, block(2), BLOB) is True and read_object(bucket, remote.name(NS, block(2))) == BLOB
    assert remote.requests["GetObject"] == 4 and tier.local_bytes == 0


def test_a_damaged_copy_is_read_around_or_deleted_with_the_blob(remote, disk):
    """A copy of the wrong size is skipped for the bucket's object (and copied afresh); a copy of
    the right size but wrong bytes is served once, and the caller's delete removes both, so the
    next write and read serve good bytes."""
    remote.write(NS, block(1), BLOB)
    tier = TieredBlobStore(remote, disk, budget_bytes=10_000)
    tier.read(NS, block(1))
    disk.path(NS, block(1)).write_bytes(b"short")
    assert tier.read(NS, block(1)) == BLOB and remote.requests["GetObject"] == 2
    assert disk.read(NS, block(1)) == BLOB

    disk.path(NS, block(1)).write_bytes(b"g" * len(BLOB))
    assert tier.read(NS, block(1)) == b"g" * len(BLOB)  # unverified, as every blob
    tier.delete(NS, block(1))  # what the cache does with a blob that fails verification
    assert on_disk(disk) == {} and stored_names(remote) == []
    assert tier.write(NS, block(1), BLOB) is True and tier.read(NS, block(1)) == BLOB


def test_a_copy_that_fails_the_check_is_dropped_alone(remote, bucket, disk):
    """``read_checked``: a copy of the right size but wrong bytes that the caller's check rejects
    is dropped, and the bucket's object, checked on its own, is served and copied afresh (the
    bucket keeps it); when the object fails too, the check's error reaches the caller, and still
    nothing is removed from the bucket (the caller's ``delete`` decides)."""

    def check(data: bytes) -> bytes:
        if data != BLOB:
            raise ValueError("not the block")
        return data

    remote.write(NS, block(1), BLOB)
    tier = TieredBlobStore(remote, disk, budget_bytes=10_000)
    assert tier.read_checked(NS, block(1), check) == BLOB and remote.requests["GetObject"] == 1
    disk.path(NS, block(1)).write_bytes(b"g" * len(BLOB))
    assert tier.read_checked(NS, block(1), check) == BLOB and remote.requests["GetObject"] == 2
    assert read_object(bucket, remote.name(NS, block(1))) == BLOB and disk.read(NS, block(1)) == BLOB
    assert tier.read_checked(NS, block(1), check) == BLOB and remote.requests["GetObject"] == 2

    write_object(bucket, remote.name(NS, block(1)), b"g" * len(BLOB))  # the bucket's damaged too
    disk.path(NS, block(1)).write_bytes(b"g" * len(BLOB))
    with pytest.raises(ValueError, match="not the block"):
        tier.read_checked(NS, block(1), check)
    assert stored_names(remote) == [remote.name(NS, block(1))] and on_disk(disk) == {}


def test_remove_takes_what_scan_found_from_both(remote, disk):
    """The collector's ``remove`` of a scanned object deletes the copy as well."""
    tier = TieredBlobStore(remote, disk, budget_bytes=10_000)
    tier.write(NS, block(1), BLOB)
    for blob in list(tier.scan()):
        tier.remove(blob)
    assert (stored_names(remote), on_disk(disk), tier.local_bytes) == ([], {}, 0)


def test_the_disk_tier_needs_an_s3_blob_url(tmp_path):
    """--blob-disk-cache with blobs in a directory is refused, naming the flag it needs."""
    with pytest.raises(ValidationError, match="it needs --blob-url s3://bucket/prefix"):
        Settings(blob_dir=tmp_path / "blobs", blob_disk_cache=tmp_path / "disk")
    with_s3 = Settings(
        blob_url="s3://bucket/kvp", blob_disk_cache=tmp_path / "disk", blob_disk_cache_bytes="1GB"
    )
    assert with_s3.blob_disk_cache_bytes == 10**9


P = random_tokens(300, seed=82)  # 300 prompt + 8 generated tokens: two full blocks, two tails


def test_a_restarted_server_serves_its_hits_from_disk(settings, tiny_model, serve, cold, s3_bucket, tmp_path):
    """Served, stopped, the bucket's objects then overwritten with garbage: a server started again
    on the same disk tier still hits 299 tokens, none failing verification, with the uncached
    answer (the copies were read, not the bucket)."""
    tiered = settings.model_copy(
        update={
            "blob_dir": None,
            "blob_url": f"s3://{s3_bucket}/kvp",
            "blob_disk_cache": tmp_path / "disk",
            "max_cache_bytes": 10**9,
            "ram_cache_bytes": 0,
        }
    )
    with serve(tiered, tiny_model) as server:
        api = Api(server)
        assert api.complete(P).cached_tokens == 0
        api.flush()
        namespace = api.engine.loaded.namespace("default")
    bucket = S3BlobStore(s3_bucket, "kvp", s3_client(read_timeout_s=10))
    stored = stored_names(bucket)
    assert sorted(on_disk(FileBlobStore(tmp_path / "disk"))) == stored
    first = bucket.name(namespace, block_hashes(P, namespace)[0])
    assert read_token_ids(read_object(bucket, first)) == P[:128]
    for name in stored:
        write_object(bucket, name, b"garbage")
    with serve(tiered, tiny_model) as server:
        api = Api(server)
        again = api.complete(P)
        assert again.cached_tokens == len(P) - 1 and api.cache.admin.stats().verification_failures == 0
    assert again.key == cold.complete(P).key


def test_a_damaged_copy_on_disk_leaves_the_bucket_its_good_object(
    settings, tiny_model, serve, cold, s3_bucket, tmp_path
):
    """Served, then block 1's copy on disk damaged (its size kept): the next request still reuses
    299 tokens, read from the bucket, with the uncached answer and no verification failure; the
    bucket keeps every object and the disk holds its good bytes again."""
    tiered = settings.model_copy(
        update={
            "blob_dir": None,
            "blob_url": f"s3://{s3_bucket}/kvp",
            "blob_disk_cache": tmp_path / "disk",
            "max_cache_bytes": 10**9,
            "ram_cache_bytes": 0,
        }
    )
    bucket = S3BlobStore(s3_bucket, "kvp", s3_client(read_timeout_s=10))
    disk = FileBlobStore(tmp_path / "disk")
    with serve(tiered, tiny_model) as server:
        api = Api(server)
        assert api.complete(P).cached_tokens == 0
        api.flush()
        namespace = api.engine.loaded.namespace("default")
        stored = stored_names(bucket)
        copy = disk.path(namespace, block_hashes(P, namespace)[1])
        good = copy.read_bytes()
        copy.write_bytes(good[: len(good) // 2] + bytes(len(good) - len(good) // 2))
        again = api.complete(P)
        assert again.cached_tokens == len(P) - 1 and api.cache.admin.stats().verification_failures == 0
        api.flush()
    assert again.key == cold.complete(P).key
    assert stored_names(bucket) == stored and copy.read_bytes() == good


def test_tmp_files_left_by_a_killed_writer_are_removed_at_start(remote, disk: FileBlobStore):
    """A writer's temporary file in the directory is gone once the tier is opened on it."""
    leftover: Path = disk.path(NS, block(1)).with_name(".x.tmp")
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"partial")
    TieredBlobStore(remote, disk, budget_bytes=10_000)
    assert on_disk(disk) == {}
