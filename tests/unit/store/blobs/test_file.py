"""store/blobs/file.py and store/blobs/s3.py: the blob-store contract on both backends (create-only writes
that survive a race, scans that name their blocks, faults as OSError), and what only files have
(FIFOs, leftover temporary files)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hashing import BlockHash
from store.blobs.file import FileBlobStore
from store.blobs.s3 import S3BlobStore, s3_client
from tests.helpers import NS, free_port
from tests.s3_fixtures import read_object, stored_names

H = BlockHash(bytes(range(16)))


def test_the_first_writer_wins_and_nothing_temporary_is_left(blob_store) -> None:
    """A second write of a block returns False and keeps the first bytes; one object, named as the
    design says."""
    assert blob_store.write(NS, H, b"first") is True
    assert blob_store.write(NS, H, b"second") is False
    assert blob_store.read(NS, H) == b"first"
    assert stored_names(blob_store) == [f"{NS.hex()}/{H.hex()[:2]}/{H.hex()}.safetensors"]
    assert blob_store.name(NS, H) == f"{NS.hex()}/{H.hex()[:2]}/{H.hex()}.safetensors"


def test_a_put_race_leaves_exactly_one_intact_blob(blob_store) -> None:
    """Two writers of each of 20 blocks, released at once with different bytes: per block exactly
    one write wins, and the stored bytes are the winner's, whole."""
    blocks = [BlockHash(bytes([i]) * 16) for i in range(20)]
    payloads = [b"a" * 50_000, b"b" * 50_000]
    results: dict[tuple[int, int], bool] = {}
    barrier = threading.Barrier(2)

    def writer(w: int) -> None:
        for i, block in enumerate(blocks):
            barrier.wait()
            results[(i, w)] = blob_store.write(NS, block, payloads[w])

    threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, block in enumerate(blocks):
        winners = [w for w in (0, 1) if results[(i, w)]]
        assert len(winners) == 1, f"block {i}: {winners}"
        assert read_object(blob_store, blob_store.name(NS, block)) == payloads[winners[0]]
    assert len(stored_names(blob_store)) == len(blocks)


def test_exists_size_delete_and_a_missing_blob(blob_store) -> None:
    """Absent: exists False, size None, read raises OSError, delete is a no-op; present: its size."""
    assert not blob_store.exists(NS, H) and blob_store.size(NS, H) is None
    with pytest.raises(OSError):
        blob_store.read(NS, H)
    blob_store.delete(NS, H)
    blob_store.write(NS, H, b"x" * 10)
    assert blob_store.exists(NS, H) and blob_store.size(NS, H) == 10
    blob_store.delete(NS, H)
    assert not blob_store.exists(NS, H) and stored_names(blob_store) == []


def test_scan_names_blocks_and_remove_takes_them(blob_store) -> None:
    """scan finds each blob with its namespace, hash, size and a fresh age; per namespace too."""
    before = time.time()
    blob_store.write(NS, H, b"x" * 10)
    [found] = blob_store.scan()
    since = time.time() - before + 1  # NOTE: + 1 s: a bucket keeps whole seconds
    assert (found.name, found.namespace_hex, found.block_hash, found.size) == (
        blob_store.name(NS, H),
        NS.hex(),
        H,
        10,
    )
    assert 0 <= found.age_s <= since
    assert [b.name for b in blob_store.scan(NS.hex())] == [found.name]
    assert blob_store.used_bytes() == 10 and list(blob_store.scan("0" * 32)) == []
    blob_store.remove(found)
    assert list(blob_store.scan()) == [] and stored_names(blob_store) == []


def test_a_fifo_in_a_blobs_place_is_an_error_not_a_hang(tmp_path) -> None:
    blobs = FileBlobStore(tmp_path)
    blobs.path(NS, H).parent.mkdir(parents=True)
    os.mkfifo(blobs.path(NS, H))
    with pytest.raises(OSError):
        blobs.read(NS, H)


def test_scan_finds_blobs_and_leftovers_and_remove_prunes_empty_directories(tmp_path) -> None:
    blobs = FileBlobStore(tmp_path)
    blobs.write(NS, H, b"x" * 10)
    leftover = blobs.path(NS, H).with_name(".x.tmp")
    leftover.write_bytes(b"partial")
    found = sorted(blobs.scan(), key=lambda b: b.name)
    assert [(b.block_hash, b.size) for b in found] == [(None, 7), (H, 10)]
    assert blobs.used_bytes() == 17 and list(blobs.scan("0" * 32)) == []
    for blob in found:
        blobs.remove(blob)
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_s3_fails_fast_with_oserror(monkeypatch) -> None:
    """Nothing listens at the endpoint: every operation raises OSError after at most two attempts
    (one retry; each refused at once), never retrying on."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    blobs = S3BlobStore("bucket", "kvp", s3_client(read_timeout_s=1))
    attempts: list[str] = []
    blobs.client.meta.events.register("before-send", lambda **_: attempts.append("sent"))
    for operation in (
        lambda: blobs.write(NS, H, b"x"),
        lambda: blobs.read(NS, H),
        lambda: blobs.exists(NS, H),
        lambda: blobs.delete(NS, H),
        lambda: list(blobs.scan()),
    ):
        attempts.clear()
        with pytest.raises(OSError):
            operation()
        assert 1 <= len(attempts) <= 2
