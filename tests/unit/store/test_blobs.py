"""store/blobs.py: create-only writes, regular files only, scans that name their blocks."""

from __future__ import annotations

import os

import pytest

from hashing import BlockHash
from store.blobs import BlobStore
from tests.helpers import NS

H = BlockHash(bytes(range(16)))


def test_the_first_writer_wins_and_nothing_temporary_is_left(tmp_path) -> None:
    blobs = BlobStore(tmp_path)
    assert blobs.write(NS, H, b"first") is True
    assert blobs.write(NS, H, b"second") is False
    assert blobs.read(NS, H) == b"first"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [f"{H.hex()}.safetensors"]
    assert blobs.name(NS, H) == f"{NS.hex()}/{H.hex()[:2]}/{H.hex()}.safetensors"


def test_a_fifo_in_a_blobs_place_is_an_error_not_a_hang(tmp_path) -> None:
    blobs = BlobStore(tmp_path)
    blobs.path(NS, H).parent.mkdir(parents=True)
    os.mkfifo(blobs.path(NS, H))
    with pytest.raises(OSError):
        blobs.read(NS, H)


def test_scan_finds_blobs_and_leftovers_and_remove_prunes_empty_directories(tmp_path) -> None:
    blobs = BlobStore(tmp_path)
    blobs.write(NS, H, b"x" * 10)
    leftover = blobs.path(NS, H).with_name(".x.tmp")
    leftover.write_bytes(b"partial")
    found = sorted(blobs.scan(), key=lambda b: b.name)
    assert [(b.block_hash, b.size) for b in found] == [(None, 7), (H, 10)]
    assert blobs.used_bytes() == 17 and list(blobs.scan("0" * 32)) == []
    for blob in found:
        blobs.remove(blob)
    assert list(tmp_path.iterdir()) == []
