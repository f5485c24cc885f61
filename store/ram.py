"""Blocks in this process's memory: ``RamTier``, an LRU of verified blocks in front of the blob
store, and ``PendingBlocks``, those the writer has not published yet.

A hot prefix is then served without reading, parsing or checksumming its blobs. The tier holds
only blocks this process verified (read from disk and checked) or computed itself, keyed by
namespace and block hash, so it never serves another tenant's or another model's K/V. It is
consulted only for blocks the Redis index still lists: TTLs, eviction and ``clear`` keep their
meaning, and a block the index dropped is never served from RAM.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from hashing import BlockHash, Namespace
from store.interface import KVBlock


def block_nbytes(block: KVBlock) -> int:
    """Bytes of a block's K and V tensors."""
    return block.key.nbytes + block.value.nbytes


class RamTier:
    """Least recently used blocks, at most ``max_bytes`` bytes of K/V in all (thread-safe).

    Args:
        max_bytes: budget in bytes; a block larger than the budget is never kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self._blocks: OrderedDict[tuple[Namespace, BlockHash], KVBlock] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, namespace: Namespace, block_hash: BlockHash) -> KVBlock | None:
        """The block, marked most recently used, or None."""
        with self._lock:
            block = self._blocks.get((namespace, block_hash))
            if block is not None:
                self._blocks.move_to_end((namespace, block_hash))
            return block

    def put(self, namespace: Namespace, block: KVBlock) -> None:
        """Keep ``block`` (its tensors must never be modified afterwards), evicting least recently
        used blocks beyond the budget."""
        size = block_nbytes(block)
        if size > self.max_bytes:
            return
        with self._lock:
            self._pop((namespace, block.block_hash))
            self._blocks[(namespace, block.block_hash)] = block
            self.used_bytes += size
            while self.used_bytes > self.max_bytes:
                self._pop(next(iter(self._blocks)))

    def drop(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Forget one block (a no-op when it is not held)."""
        with self._lock:
            self._pop((namespace, block_hash))

    def clear(self, namespace_hex: str | None = None) -> None:
        """Forget every block, or those of one namespace (hex digest)."""
        with self._lock:
            for key in [k for k in self._blocks if namespace_hex is None or k[0].hex() == namespace_hex]:
                self._pop(key)

    def _pop(self, key: tuple[Namespace, BlockHash]) -> None:
        block = self._blocks.pop(key, None)
        if block is not None:
            self.used_bytes -= block_nbytes(block)


class PendingView(NamedTuple):
    """What ``PendingBlocks`` held at one moment for one prompt: its pending blocks by hash, and
    the pending tails after the root (key None) and after each of its blocks."""

    blocks: dict[BlockHash, KVBlock]
    tails: dict[BlockHash | None, list[KVBlock]]


class PendingBlocks:
    """Blocks and tails handed to the writer and not yet published (or given up), by namespace
    and hash; tails also by what they follow (``tails``)."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[Namespace, BlockHash], KVBlock] = {}
        self._tails: dict[tuple[Namespace, BlockHash | None], dict[BlockHash, KVBlock]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def add(self, namespace: Namespace, blocks: Iterable[KVBlock]) -> None:
        with self._lock:
            self._blocks.update(((namespace, b.block_hash), b) for b in blocks)

    def add_tail(self, namespace: Namespace, tip: BlockHash | None, tail: KVBlock) -> None:
        """A pending tail after ``tip`` (None: the root)."""
        with self._lock:
            self._blocks[(namespace, tail.block_hash)] = tail
            self._tails.setdefault((namespace, tip), {})[tail.block_hash] = tail

    def get(self, namespace: Namespace, block_hash: BlockHash) -> KVBlock | None:
        with self._lock:
            return self._blocks.get((namespace, block_hash))

    def tails(self, namespace: Namespace, tip: BlockHash | None) -> list[KVBlock]:
        """The pending tails after ``tip`` (None: the root)."""
        with self._lock:
            return list(self._tails.get((namespace, tip), {}).values())

    def view(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> PendingView:
        """The pending blocks among ``hashes`` (a prompt's chain) and the pending tails after the
        root and after each of them, as they are now.

        NOTE: a lookup takes it before its index round trip: a block or tail the writer publishes
        meanwhile (and then no longer holds) is listed by the index or served from this copy,
        never lost in between, so a request sent the moment its previous turn ended always finds
        what that turn computed.
        """
        with self._lock:
            if not self._blocks:
                return PendingView({}, {})
            held = ((h, self._blocks.get((namespace, h))) for h in hashes)
            blocks = {h: block for h, block in held if block is not None}
            after = ((tip, self._tails.get((namespace, tip))) for tip in (None, *hashes))
            return PendingView(blocks, {tip: list(tails.values()) for tip, tails in after if tails})

    def remove(self, namespace: Namespace, blocks: Iterable[KVBlock]) -> None:
        with self._lock:
            for block in blocks:
                self._blocks.pop((namespace, block.block_hash), None)
                for key in [
                    k for k, listed in self._tails.items() if k[0] == namespace and block.block_hash in listed
                ]:
                    del self._tails[key][block.block_hash]
                    if not self._tails[key]:
                        del self._tails[key]
