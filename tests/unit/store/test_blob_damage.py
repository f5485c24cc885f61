"""What stands in a blob's place decides damage (docs/operations.md, "Damaged and malformed cache
files"): anything but a readable regular file of a plausible size is the blob's fault, a miss that
drops it with its index entry, and the next save stores it again. Through the cache's own API, on
the in-memory index double and a real blob directory (and moto's S3 for the size bound)."""

from __future__ import annotations

import os
import resource
import socket
import stat
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from hashing import BLOCK_SIZE, tail_hash
from store.blobs.base import NotABlob
from store.blobs.file import FileBlobStore
from store.blobs.s3 import S3BlobStore, s3_client
from store.cache import BlockCache
from store.entries import member_name
from store.index.memory.index import MemoryIndex
from store.outcomes import MissReason, first_miss
from tests.helpers import HANG_S, NS, SPEC, Clock
from tests.unit.store.test_cache_story import HASHES, IDS, HangingBlobs, cache_on, stored


@pytest.fixture
def clock() -> Clock:
    return Clock()


def unix_socket(p: Path) -> None:
    p.unlink()
    here = os.getcwd()
    os.chdir(p.parent)  # NOTE: a socket's path is bounded (108 bytes): bind it by its name
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(p.name)  # the file stays after the socket closes
    finally:
        os.chdir(here)


def parent_is_a_file(p: Path) -> None:
    for f in p.parent.iterdir():
        f.unlink()
    p.parent.rmdir()
    p.parent.write_bytes(b"not a directory")


def namespace_dir_is_a_file(p: Path) -> None:
    import shutil

    shutil.rmtree(p.parent.parent)
    p.parent.parent.write_bytes(b"not a directory")


def replace_with_link(target: str) -> Callable[[Path], None]:
    def damage(p: Path) -> None:
        p.unlink()
        os.symlink(target, p)

    return damage


def device_node(p: Path) -> None:
    p.unlink()
    os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # as /dev/zero


def unreadable(p: Path) -> None:
    p.chmod(0)


def link_to_sibling(p: Path) -> None:
    sibling = p.with_name("0" * 64 + ".safetensors")
    p.rename(sibling)
    os.symlink(sibling.name, p)


AS_ROOT = os.geteuid() == 0
KINDS: dict[str, Callable[[Path], None]] = {
    "unix-socket": unix_socket,  # open: ENXIO
    "self-link": lambda p: (p.unlink(), os.symlink(p.name, p)),  # ELOOP
    "dangling-link": replace_with_link("nowhere"),
    "link-to-dev-zero": replace_with_link("/dev/zero"),
    "link-to-a-blob": link_to_sibling,  # a regular file behind it: still no blob (blobs are never links)
    "link-to-directory": replace_with_link("/"),
    "parent-is-a-file": parent_is_a_file,  # ENOTDIR
    "namespace-dir-is-a-file": namespace_dir_is_a_file,
    "fifo": lambda p: (p.unlink(), os.mkfifo(p)),
    "directory": lambda p: (p.unlink(), p.mkdir(), (p / "x").write_bytes(b"x")),
}
if AS_ROOT:
    KINDS["device-node"] = device_node  # mknod needs root
else:
    KINDS["chmod-000"] = unreadable  # EACCES on a file of ours (root reads it anyway)


@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
def test_anything_but_a_regular_file_is_damage_dropped_then_stored_again(clock, tmp_path, kind) -> None:
    """Block 1's blob is replaced by ``kind``: the collector's scan copes, the lookup serves block 0
    ("failed verification"; none when the namespace's directory is gone), drops the entry and what
    stands there; the next save and lookup hit."""
    blobs, index = FileBlobStore(tmp_path), MemoryIndex(clock)
    cache = cache_on(index, blobs)
    stored(cache)
    KINDS[kind](blobs.path(NS, HASHES[1]))
    list(blobs.scan())  # never follows a link, never raises for what it finds

    match = cache.lookup(NS, IDS)
    served = 0 if kind == "namespace-dir-is-a-file" else 1
    assert (match.num_blocks, match.miss_reason) == (served, MissReason.FAILED_VERIFICATION)
    assert cache.admin.stats().verification_failures == 1 and cache.admin.stats().read_errors == 0
    assert member_name(NS, HASHES[served]) not in index.tables.lru
    assert not os.path.lexists(blobs.path(NS, HASHES[served]))

    # NOTE: without its namespace's directory every blob is gone: the entries after the damaged
    # block went with it, so the one save of the request that met it stores them all again
    assert all(member_name(NS, h) not in index.tables.lru for h in HASHES[served:])
    stored(cache)
    assert cache.lookup(NS, IDS).num_blocks == 3
    cache.admin.gc(grace_s=0)  # the collector copes with what was left around


def test_a_file_in_a_blob_directorys_place_does_not_stop_saves(clock, tmp_path) -> None:
    """A plain file where a blob's directory belongs, with no index entry to drop: a save stores
    the blob anyway (the file is removed), and the lookup hits."""
    blobs = FileBlobStore(tmp_path)
    path = blobs.path(NS, HASHES[0])
    path.parent.parent.mkdir(parents=True)
    path.parent.write_bytes(b"in the way")
    cache = cache_on(MemoryIndex(clock), blobs)
    stored(cache)
    assert cache.lookup(NS, IDS).num_blocks == 3


HUGE = 400 * 2**20  # a sparse file: no disk, but reading it would take 400 MiB


def test_a_huge_file_in_a_blobs_place_is_refused_unread(clock, tmp_path) -> None:
    """A sparse file of 400 MiB as block 1's blob: a miss, dropped, refused from its size (the
    process's memory grows by nothing near it), then stored again."""
    blobs, index = FileBlobStore(tmp_path), MemoryIndex(clock)
    cache = cache_on(index, blobs)
    stored(cache)
    assert 4 * SPEC.block_bytes + 2**20 < HUGE // 100  # far over any bound the cache reads to
    with open(blobs.path(NS, HASHES[1]), "r+b") as f:
        f.truncate(HUGE)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    try:
        match = cache.lookup(NS, IDS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < HUGE // 10 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss < HUGE // 2
    assert (match.num_blocks, match.miss_reason) == (1, MissReason.FAILED_VERIFICATION)
    assert member_name(NS, HASHES[1]) not in index.tables.lru and not blobs.exists(NS, HASHES[1])
    stored(cache)
    assert cache.lookup(NS, IDS).num_blocks == 3


def test_a_blob_over_the_bound_is_not_a_blob_without_reading_it(tmp_path) -> None:
    blobs = FileBlobStore(tmp_path)
    blobs.write(NS, HASHES[0], b"x" * 100)
    assert blobs.read(NS, HASHES[0], 100) == b"x" * 100
    with pytest.raises(NotABlob):
        blobs.read(NS, HASHES[0], 99)


def test_an_s3_object_over_the_bound_is_not_a_blob(s3_bucket) -> None:
    """The bound holds on S3 too (the GET's ContentLength decides, its body unread); a missing
    object is ``FileNotFoundError``."""
    blobs = S3BlobStore(s3_bucket, "p", s3_client(10))
    blobs.write(NS, HASHES[0], b"x" * 100)
    assert blobs.read(NS, HASHES[0], 100) == b"x" * 100
    with pytest.raises(NotABlob):
        blobs.read(NS, HASHES[0], 99)
    with pytest.raises(FileNotFoundError):
        blobs.read(NS, HASHES[1], 99)


def with_tail(cache: BlockCache) -> Path:
    """``IDS``'s 3 blocks and its 10-token tail stored; the tail's blob path."""
    key, value = stored(cache)
    cache.save_tail(NS, IDS, key[0, :, :, :10].contiguous(), value[0, :, :, :10].contiguous())
    assert cache.flush(HANG_S)
    return cache.parts.blobs.path(NS, tail_hash(HASHES[-1], tuple(IDS[3 * BLOCK_SIZE :])))  # type: ignore[attr-defined]


TAIL_DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbage": lambda p: p.write_bytes(b"\0" * 64),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "directory": lambda p: (p.unlink(), p.mkdir()),
    "unix-socket": unix_socket,
    "huge": lambda p: os.truncate(p, HUGE),
}


@pytest.mark.parametrize("damage", TAIL_DAMAGE, ids=list(TAIL_DAMAGE))
def test_a_damaged_tail_is_explained_as_failed_verification(clock, tmp_path, damage) -> None:
    """Every block hits; the tail that would serve the rest is damaged: it is dropped and the miss
    is explained as "failed verification" (not "partial last block"); the next save heals it."""
    cache = cache_on(MemoryIndex(clock), FileBlobStore(tmp_path))
    path = with_tail(cache)
    longer = [*IDS, 7]  # the tail's 10 tokens, then one more: all 10 served
    assert cache.lookup(NS, longer).tail_tokens == 10
    TAIL_DAMAGE[damage](path)

    match = cache.lookup(NS, longer)
    assert (match.num_blocks, match.tail_tokens) == (3, 0)
    assert match.miss_reason == MissReason.FAILED_VERIFICATION
    assert first_miss(len(IDS) + 1, 3, match.miss_reason, match.num_tokens) == (
        3,
        MissReason.FAILED_VERIFICATION,
    )
    assert not os.path.lexists(path)
    with_tail(cache)
    assert cache.lookup(NS, longer).tail_tokens == 10


def test_a_missing_tail_is_still_a_partial_last_block_when_none_was_stored(clock, tmp_path) -> None:
    cache = cache_on(MemoryIndex(clock), FileBlobStore(tmp_path))
    stored(cache)
    match = cache.lookup(NS, IDS)
    assert (match.num_blocks, match.miss_reason) == (3, None)
    assert first_miss(len(IDS), 3, None, match.num_tokens) == (3, MissReason.PARTIAL_LAST_BLOCK)


def test_an_explanations_reads_are_bounded_by_the_read_timeout(clock, tmp_path) -> None:
    """The sibling an explanation compares with hangs on its read: ``divergence`` gives up after
    the cache's read timeout (no divergence) while the read still hangs, as a lookup would."""
    blobs = HangingBlobs(tmp_path, set())
    cache = cache_on(MemoryIndex(clock), blobs, read_timeout_s=1.0)
    stored(cache)
    other = IDS[:BLOCK_SIZE] + [t + 1 for t in IDS[BLOCK_SIZE:]]  # diverges at token 128
    assert cache.admin.divergence(NS, other, 1) is not None  # the sibling is block 1 of IDS
    blobs.hang.add(HASHES[1])
    found: list[object] = []
    asked = threading.Thread(target=lambda: found.append(cache.admin.divergence(NS, other, 1)), daemon=True)
    asked.start()
    asked.join(timeout=30)  # NOTE: not a timing assertion: the hang lasts HANG_S (300 s)
    try:
        assert not asked.is_alive(), "divergence waited on a hanging read past the read timeout"
        assert blobs.reading.is_set() and not blobs.release.is_set() and found == [None]
    finally:
        blobs.release.set()
