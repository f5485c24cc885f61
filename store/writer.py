"""The writer: the one path by which blocks and tails enter the cache, and its background thread.

A request hands its new blocks to ``BlockWriter.save`` (its tail to ``save_tail``) and goes on;
the thread writes each blob, then the batch's index entries (never the reverse), keeps them in
the RAM tier, adds to the shared counters, and evicts least recently used blocks over the byte
budget. Until published, ``PendingBlocks`` serves them anyway, so a request that follows at once
still hits. A snapshot import publishes its verified blocks the same way (``publish_verified``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import torch

from hashing import BlockHash, Namespace
from store.background import yield_to_requests
from store.codec import served
from store.counts import SharedCounts
from store.entries import new_entry
from store.errors import StoreUnavailable
from store.gc import evict_to_budget
from store.index.base import Publication
from store.interface import KVBlock, KVSpec
from store.parts import CacheOptions, StoreParts
from store.ram import PendingBlocks
from store.serde import encode_block
from store.stored import Published, Stored, blocks_to_store, tail_to_store

log = logging.getLogger(__name__)

RETRY_COUNTS_S = 5.0
"""Seconds after which an idle writer tries again to add counts a failed flush left."""


class BlockWriter:
    """The background writer (see the module docstring).

    Args:
        parts: the cache's shared parts.
        spec: the shape and dtype blocks are encoded in.
        options: ``max_bytes``, the budget (checked after every publish: exceeded by at most one
            batch per concurrent writer), ``namespace_max_bytes``, a tenant's share of it, and
            ``max_pending_saves``, the queue's bound, beyond which saves are dropped and counted
            (a slow disk never holds tensors without limit).
    """

    def __init__(self, parts: StoreParts, spec: KVSpec, options: CacheOptions) -> None:
        self.parts, self.spec, self.options = parts, spec, options
        self.pending = PendingBlocks()
        self.counts = SharedCounts(parts.counters, parts.stats_guard)
        # NOTE: one background thread does every write (blobs, index entries, shared counters), so
        # nothing a request does waits on the disk or on a second Redis round trip.
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=options.max_pending_saves)
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
        self._queue(namespace, blocks_to_store(namespace, token_ids, first_block, key, value, ttls))

    def save_tail(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: int,
    ) -> None:
        """Queue the tail of ``token_ids`` (see ``PrefixCache.save_tail``) with a TTL of ``ttl_s``
        seconds."""
        self._queue(namespace, [tail_to_store(namespace, token_ids, key, value, ttl_s)])

    def _queue(self, namespace: Namespace, batch: list[Stored]) -> None:
        """Hand ``batch`` to the writer thread, served as pending meanwhile (a full queue drops it)."""
        created, blocks = time.time(), [item.block for item in batch]
        for item in batch:
            if item.block.is_tail:
                self.pending.add_tail(namespace, item.parent, item.block)
        self.pending.add(namespace, [b for b in blocks if not b.is_tail])
        if not self.enqueue(lambda: self._write(namespace, batch, created)):
            self.pending.remove(namespace, blocks)
            self.parts.recorder.add(saves_dropped=len(blocks))
            self.parts.guard.warn("queue", "save queue full: %d blocks not cached", len(blocks))

    def publish_verified(
        self, namespace: Namespace, batch: Sequence[Stored], imported: bool = False
    ) -> Published:
        """Store and index blocks verified elsewhere (a snapshot import), on the caller's thread,
        exactly as saves are stored (``_publish``); ``imported`` marks their entries as waiting
        for their audit (``IndexEntry.imported``).

        Raises:
            StoreUnavailable: the index failed.
        """
        return self._publish(namespace, batch, time.time(), imported)

    def missing(self, namespace: Namespace, hashes: Sequence[BlockHash]) -> list[bool]:
        """Per block, whether the index lacks it (one round trip).

        Raises:
            StoreUnavailable: the index failed.
        """
        scope = namespace.hex()
        found = self.parts.guard.redis("exists", self.parts.index.missing, namespace, hashes, scope=scope)
        if found is None:
            raise StoreUnavailable("the index (Redis) is unreachable")
        return found

    def share(
        self, namespace: Namespace | None = None, *, also: Callable[[], object] | None = None, **counts: int
    ) -> None:
        """Add to the deployment-wide counters (and the namespace's) in the background; ``also``
        (another statistic, e.g. a hot prefix's hit) runs in the same flush, through the same
        breaker. Counts are merged until the writer adds them (``store.counts``): a full queue or
        a failing Redis delays them, never drops them."""
        scope = namespace.hex() if namespace is not None else None
        if self.counts.add(scope, counts, also) and not self.enqueue(self.counts.flush):
            self.counts.unqueued()

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
        """Evict least recently used blocks until within ``max_bytes`` (``store.gc.evict_to_budget``)."""
        budget, share = self.options.max_bytes, self.options.namespace_max_bytes
        if budget is not None and (evicted := evict_to_budget(self.parts, budget, share)):
            self.share(None, evicted_budget=evicted)

    def _loop(self) -> None:
        yield_to_requests()
        while True:
            try:
                job = self._jobs.get(timeout=RETRY_COUNTS_S)
            except queue.Empty:  # NOTE: counts a failed flush left wait for no new request
                if self.counts.waiting:
                    self.counts.flush()
                continue
            try:
                job()
            except Exception:  # a bug here must not kill the writer thread
                log.exception("unexpected error in the cache writer")
                self.parts.recorder.add(save_errors=1)
            finally:
                self._jobs.task_done()

    def _write(self, namespace: Namespace, batch: Sequence[Stored], created: float) -> None:
        try:
            failure = self._publish(namespace, batch, created).failure
            if failure is not None:
                blobs = self.parts.blobs.url
                self.parts.guard.warn(
                    "write", "cannot write block blobs to %s (%s): serving without saving", blobs, failure
                )
        except StoreUnavailable:
            pass  # NOTE: the guard counted and logged it; the blocks are simply not cached
        finally:
            self.pending.remove(namespace, [s.block for s in batch])

    def _publish(
        self, namespace: Namespace, batch: Sequence[Stored], created: float, imported: bool = False
    ) -> Published:
        """Write each new block's blob, then index them all in one round trip (never the
        reverse: an entry never points at a partial blob); count them as saved; keep them in the
        RAM tier. A failed blob write stops the batch there (the blocks before it are indexed).

        Raises:
            StoreUnavailable: the index failed.
        """
        parts = self.parts
        # NOTE: a blob that cannot be indexed is never written
        missing = self.missing(namespace, [s.block.block_hash for s in batch])
        stored: list[bool | None] = [None] * len(batch)
        # NOTE: the RAM tier takes a block only as the index serves it: one this process computed
        # for those tokens, or the one whose blob it just wrote; never an import's copy of a block
        # already indexed (whose blob holds someone else's bytes)
        kept = [not needed and item.data is None for item, needed in zip(batch, missing, strict=True)]
        publications: list[Publication] = []
        failure: OSError | None = None
        for i, (item, needed) in enumerate(zip(batch, missing, strict=True)):
            block = item.block
            if needed:
                data = item.data or self._encode(block, namespace, item.parent)
                try:
                    # NOTE: a blob already there (its entry expired, the file not yet collected) is
                    # kept, create-only: the entry then names its bytes, not ours
                    kept[i] = parts.blobs.write(namespace, block.block_hash, data)
                except OSError as exc:
                    parts.recorder.add(save_errors=1)
                    failure = exc
                    break
                name = parts.blobs.name(namespace, block.block_hash)
                tail = len(block.token_ids) if block.is_tail else 0
                entry = new_entry(name, len(data), item.parent, imported, tail)
                at = (entry, item.ttl_s, created, item.short_hash, block.token_ids if tail else ())
                publications.append(Publication(block.block_hash, item.parent, block.index, *at))
            stored[i] = needed
        total = self._index(namespace, publications) if publications else None
        for item, done, keep in zip(batch, stored, kept, strict=True):
            if done is not None and keep:
                parts.ram.put(namespace, item.block if item.data else served(item.block, self.spec))
        # NOTE: after the RAM tier took the batch, so a block evicted now leaves it too
        if total is not None and total > (self.options.max_bytes or total):
            self.evict_to_budget()
        return Published(stored, failure)

    def _encode(self, block: KVBlock, namespace: Namespace, parent: BlockHash | None) -> bytes:
        started = time.perf_counter()
        data = encode_block(block, namespace, parent, self.spec)
        self.parts.recorder.add_coded("encode", block, len(data), time.perf_counter() - started)
        return data

    def _index(self, namespace: Namespace, publications: list[Publication]) -> int:
        """Publish the entries of blobs just written and count them; returns the bytes the
        blob store holds now.

        Raises:
            StoreUnavailable: the index failed (the blobs stay for the collector).
        """
        parts = self.parts
        total = parts.guard.redis(
            "publish", parts.index.publish, namespace, publications, scope=namespace.hex()
        )
        if total is None:
            raise StoreUnavailable("the index (Redis) is unreachable")
        tails = [p.entry.size for p in publications if p.entry.tail]
        saved = len(publications) - len(tails)
        parts.recorder.add(blocks_saved=saved, tails_saved=len(tails), tail_bytes_saved=sum(tails))
        self.share(namespace, blocks_saved=saved, tails_saved=len(tails), tail_bytes_saved=sum(tails))
        return total
