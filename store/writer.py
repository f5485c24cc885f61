"""The writer: one background thread that stores blocks and everything else the cache writes.

A request hands its new blocks to ``BlockWriter.save`` and goes on; the thread writes each
block's blob, then its index entry (never the reverse), keeps it in the RAM tier, adds to the
deployment-wide counters, and evicts least recently used blocks once the blob store is over its
byte budget. Until a block is published, ``PendingBlocks`` lets this process serve it anyway, so
a request that follows at once still hits.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes, block_tokens
from store.blob_backend import BlobBackend
from store.entries import new_entry, parse_member
from store.guard import Guard
from store.interface import KVBlock, KVSpec
from store.parts import BlockIndex, Counters
from store.ram import RamTier
from store.serde import encode_block
from store.stats import StatsRecorder

log = logging.getLogger(__name__)


class PendingBlocks:
    """Blocks handed to the writer and not yet published (or given up), by namespace and hash."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[Namespace, BlockHash], KVBlock] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def add(self, namespace: Namespace, blocks: Iterable[KVBlock]) -> None:
        with self._lock:
            self._blocks.update(((namespace, b.block_hash), b) for b in blocks)

    def get(self, namespace: Namespace, block_hash: BlockHash) -> KVBlock | None:
        with self._lock:
            return self._blocks.get((namespace, block_hash))

    def remove(self, namespace: Namespace, blocks: Iterable[KVBlock]) -> None:
        with self._lock:
            for block in blocks:
                self._blocks.pop((namespace, block.block_hash), None)


@dataclass(frozen=True)
class _SaveJob:
    namespace: Namespace
    blocks: list[KVBlock]  # consecutive, in chain order
    parent: BlockHash | None  # of the first block
    ttls: list[int]  # seconds, per block
    created: float = field(default_factory=time.time)


class BlockWriter:
    """The background writer (see the module docstring).

    Args:
        counters: the deployment-wide counters and the breaker of their own they are written
            through (``StoreAdmin.stats_guard``).
        max_bytes: budget of the blob store in bytes (None: no budget); checked after every
            publish, so it is exceeded by at most one block per concurrent writer.
        max_jobs: bound of the queue; beyond it saves are dropped and counted, so a slow disk
            never holds tensors without limit.
    """

    def __init__(
        self,
        index: BlockIndex,
        blobs: BlobBackend,
        ram: RamTier,
        counters: tuple[Counters, Guard],
        spec: KVSpec,
        guard: Guard,
        stats: StatsRecorder,
        *,
        max_bytes: int | None,
        max_jobs: int,
    ) -> None:
        self.index, self.blobs, self.ram = index, blobs, ram
        self.counters, self.stats_guard = counters
        self.spec, self.guard, self.stats = spec, guard, stats
        self.max_bytes = max_bytes
        self.pending = PendingBlocks()
        # NOTE: one background thread does every write (blobs, index entries, shared counters), so
        # nothing a request does waits on the disk or on a second Redis round trip.
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=max_jobs)
        threading.Thread(target=self._loop, name="kvproxy-writer", daemon=True).start()

    def save(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        first_block: int,
        key: torch.Tensor,
        value: torch.Tensor,
        ttls: Sequence[int],
    ) -> None:
        """Queue blocks ``first_block ..`` of ``token_ids`` (see ``PrefixCache.save``) with the
        TTLs ``ttls`` (seconds, one per block)."""
        assert key.shape[3] == BLOCK_SIZE and key.is_contiguous(), key.shape
        end = first_block + key.shape[0]
        hashes = block_hashes(token_ids[: end * BLOCK_SIZE], namespace)
        pairs = zip(key.unbind(0), value.unbind(0), strict=True)
        blocks = [
            KVBlock(i, hashes[i], block_tokens(token_ids, i), k, v)
            for i, (k, v) in enumerate(pairs, start=first_block)
        ]
        job = _SaveJob(namespace, blocks, hashes[first_block - 1] if first_block else None, list(ttls))
        self.pending.add(namespace, blocks)
        if not self.enqueue(lambda: self._write(job)):
            self.pending.remove(namespace, blocks)
            self.stats.add(saves_dropped=len(blocks))
            self.guard.warn("queue", "save queue full: %d blocks not cached", len(blocks))

    def share(
        self, namespace: Namespace | None = None, *, also: Callable[[], object] | None = None, **counts: int
    ) -> None:
        """Add to the deployment-wide counters (and the namespace's) in the background; ``also``
        (another statistic, e.g. a hot prefix's hit) runs in the same job, through the same
        breaker, so a lookup costs the writer's queue one job."""
        if self.stats_guard.allow():
            scope = namespace.hex() if namespace is not None else None

            def job() -> None:
                self.stats_guard.redis("stats", self.counters.add, scope, counts)
                if also is not None:
                    self.stats_guard.redis("stats", also)

            self.enqueue(job)

    def enqueue(self, job: Callable[[], None]) -> bool:
        """Run ``job`` on the writer thread; False when the queue is full (nothing queued)."""
        try:
            self._jobs.put_nowait(job)
            return True
        except queue.Full:
            return False

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued job is done; True when that took at most ``timeout_s`` s."""
        with self._jobs.all_tasks_done:
            return self._jobs.all_tasks_done.wait_for(
                lambda: self._jobs.unfinished_tasks == 0, timeout=timeout_s
            )

    def evict_to_budget(self) -> None:
        """Evict least recently used blocks (index, RAM tier, blobs) until within ``max_bytes``."""
        if self.max_bytes is None:
            return
        evicted = self.guard.redis("evict", self.index.evict, self.max_bytes) or []
        for member in evicted:
            namespace, block_hash = parse_member(member)
            self.ram.drop(namespace, block_hash)
            try:
                self.blobs.delete(namespace, block_hash)
            except OSError as exc:  # unindexed now: the garbage collector removes it later
                self.guard.warn("evict", "cannot delete an evicted blob from %s (%s)", self.blobs.url, exc)
        if evicted:
            self.stats.add(evicted_budget=len(evicted))
            self.share(None, evicted_budget=len(evicted))

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:  # a bug here must not kill the writer thread
                log.exception("unexpected error in the cache writer")
                self.stats.add(save_errors=1)
            finally:
                self._jobs.task_done()

    def _write(self, job: _SaveJob) -> None:
        try:
            self._publish(job)
        finally:
            self.pending.remove(job.namespace, job.blocks)

    def _publish(self, job: _SaveJob) -> None:
        """Write each block's blob, then its index entry (never the reverse); keep it in RAM."""
        # NOTE: a blob that cannot be indexed is never written
        hashes = [b.block_hash for b in job.blocks]
        scope = job.namespace.hex()
        missing = self.guard.redis("exists", self.index.missing, job.namespace, hashes, scope=scope)
        if missing is None:
            return
        parent = job.parent
        for block, needed, ttl_s in zip(job.blocks, missing, job.ttls, strict=True):
            block_parent, parent = parent, block.block_hash
            if not needed:
                self.ram.put(job.namespace, block)
                continue
            data = encode_block(block, job.namespace, block_parent, self.spec)
            try:
                self.blobs.write(job.namespace, block.block_hash, data)
            except OSError as exc:
                self.stats.add(save_errors=1)
                self.guard.warn(
                    "write",
                    "cannot write block blobs to %s (%s): serving without saving",
                    self.blobs.url,
                    exc,
                )
                return
            entry = new_entry(self.blobs.name(job.namespace, block.block_hash), len(data), block_parent)
            args = (job.namespace, block.block_hash, block_parent, block.index, entry, ttl_s, job.created)
            total = self.guard.redis("publish", self.index.publish, *args, scope=scope)
            if total is None:
                return
            self.ram.put(job.namespace, block)
            self.stats.add(blocks_saved=1)
            self.share(job.namespace, blocks_saved=1)
            if self.max_bytes is not None and total > self.max_bytes:
                self.evict_to_budget()
