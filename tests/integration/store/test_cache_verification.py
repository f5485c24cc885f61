"""Verification: a damaged index entry or blob is a miss from that block on, never a
wrong answer; the bad entry is removed and counted, and the next request stores the block again."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from hashing import block_hashes
from tests.helpers import random_tokens
from tests.topology_fixtures import TOPOLOGIES, topology_url

PROMPT = random_tokens(3 * 128 + 20, seed=5)


@pytest.fixture(params=TOPOLOGIES)
def redis_url(request) -> str:
    """The index on one Redis, on a Redis Cluster and under Sentinel, in turn."""
    return topology_url(request)


@pytest.fixture
def settings(settings):
    """Blobs on disk are what these tests damage: no RAM tier in front of them."""
    return settings.model_copy(update={"ram_cache_bytes": 0})


def rewrite(path: Path, change: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> None:
    """Re-encode a blob with its metadata kept and its tensors changed."""
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    save_file(change(tensors), str(path), metadata=metadata)


def collision(path: Path) -> None:
    """Same hash, same metadata, other token ids: what a hash collision would look like."""
    rewrite(path, lambda t: t | {"token_ids": torch.flip(t["token_ids"], [0])})


def flip_tensor_bytes(path: Path) -> None:
    """Overwrite bytes in the middle of the tensor data; header and size unchanged."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def unix_socket(path: Path) -> None:
    """A UNIX socket in the blob's place (bound by name: a socket's path is at most 108 bytes)."""
    path.unlink()
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(here)


def parent_is_a_file(path: Path) -> None:
    """The blob's directory replaced by a plain file."""
    shutil.rmtree(path.parent)
    path.parent.write_bytes(b"not a directory")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "tensor-bytes": flip_tensor_bytes,
    "collision": collision,
    "deleted": lambda p: p.unlink(),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "random-header": lambda p: p.write_bytes(
        torch.randint(0, 256, (64,)).byte().numpy().tobytes() + p.read_bytes()[64:]
    ),
    "wrong-dtype": lambda p: rewrite(
        p, lambda t: t | {"key": t["key"].bfloat16(), "value": t["value"].bfloat16()}
    ),
    "wrong-shape": lambda p: rewrite(p, lambda t: t | {"key": t["key"][:1], "value": t["value"][:1]}),
    "pickle": lambda p: p.write_bytes(pickle.dumps({"key": [0.0] * 16})),
    "fifo": lambda p: (p.unlink(), os.mkfifo(p)),  # a read would block forever
    "directory": lambda p: (p.unlink(), p.mkdir()),
    # NOTE: not I/O errors: what stands there is no blob (docs/operations.md, damaged files)
    "unix-socket": unix_socket,  # open: ENXIO
    "self-link": lambda p: (p.unlink(), os.symlink(p.name, p)),  # ELOOP
    "link-to-dev-zero": lambda p: (p.unlink(), os.symlink("/dev/zero", p)),
    "parent-is-a-file": parent_is_a_file,  # ENOTDIR
    "huge-sparse": lambda p: os.truncate(p, 400 * 2**20),  # refused from its size, unread
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_block_is_a_miss_from_there_on(cached, cold, settings, damage) -> None:
    cached.complete(PROMPT)
    cached.flush()
    namespace = cached.engine.loaded.namespace("default")
    hashes = block_hashes(PROMPT, namespace)
    DAMAGE[damage](cached.cache.parts.blobs.path(namespace, hashes[1]))
    failures = cached.cache.admin.stats().verification_failures

    damaged = cached.complete(PROMPT)
    assert damaged.status == 200
    assert damaged.cached_tokens == 128  # block 0 only: the prefix ends at the damaged block
    assert damaged.key == cold.complete(PROMPT).key
    assert cached.cache.admin.stats().verification_failures == failures + 1
    cached.flush()  # the request re-stored block 1 (and 2) in the background

    healed = cached.complete(PROMPT)
    assert healed.cached_tokens == len(PROMPT) - 1 and healed.key == damaged.key  # blocks, then the tail
    assert cached.cache.admin.stats().verification_failures == failures + 1


def test_bad_entry_is_removed_before_the_block_is_stored_again(cached, settings, redis_client) -> None:
    """While the damaged block is being re-stored, no entry points at the bad blob."""
    cached.complete(PROMPT)
    cached.flush()
    namespace = cached.engine.loaded.namespace("default")
    block = block_hashes(PROMPT, namespace)[1]
    collision(cached.cache.parts.blobs.path(namespace, block))
    match = cached.cache.lookup(namespace, PROMPT, max_blocks=3)  # what a request does first
    assert match.num_blocks == 1
    assert not redis_client.exists(cached.cache.parts.index.block_key(namespace, block))
    assert not (cached.cache.parts.blobs.path(namespace, block)).exists()
