"""The RAM tier's LRU and byte budget."""

from __future__ import annotations

import torch

from hashing import BlockHash, Namespace
from store.interface import KVBlock
from store.ram import RamTier, block_nbytes

NS = Namespace(bytes(16))
OTHER = Namespace(b"\1" * 16)


def block(i: int) -> KVBlock:
    return KVBlock(
        i, BlockHash(bytes([i]) * 16), (i,) * 128, torch.zeros(2, 1, 128, 4), torch.zeros(2, 1, 128, 4)
    )


SIZE = block_nbytes(block(0))


def test_least_recently_used_goes_first_and_the_budget_holds() -> None:
    ram = RamTier(2 * SIZE)
    ram.put(NS, block(0))
    ram.put(NS, block(1))
    assert ram.get(NS, block(0).block_hash) is not None  # 0 is now the most recently used
    ram.put(NS, block(2))
    assert ram.get(NS, block(1).block_hash) is None
    assert ram.get(NS, block(0).block_hash) is not None and ram.get(NS, block(2).block_hash) is not None
    assert ram.used_bytes == 2 * SIZE and len(ram) == 2


def test_namespaces_never_meet_and_clear_drop_forget() -> None:
    ram = RamTier(10 * SIZE)
    ram.put(NS, block(0))
    assert ram.get(OTHER, block(0).block_hash) is None
    ram.put(OTHER, block(0))
    ram.put(NS, block(0))  # replacing keeps one copy
    assert len(ram) == 2 and ram.used_bytes == 2 * SIZE
    ram.clear(OTHER.hex())
    assert ram.get(OTHER, block(0).block_hash) is None and ram.get(NS, block(0).block_hash) is not None
    ram.drop(NS, block(0).block_hash)
    assert len(ram) == 0 and ram.used_bytes == 0


def test_zero_budget_keeps_nothing() -> None:
    ram = RamTier(0)
    ram.put(NS, block(0))
    assert len(ram) == 0 and ram.used_bytes == 0
