"""``BlockCache``: the facade that matches, loads, verifies, saves, evicts and collects blocks.

It composes the Redis index (metadata, TTLs, LRU order, sizes), the RAM tier (hot blocks in
process memory), the blob store (tensors on disk) and the serde (verification). Every fault of
those parts becomes a cache miss or a skipped save, counted and logged, never an exception for
the caller.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TypeVar

import redis
import torch

from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes
from store.blobs import BlobStore
from store.breaker import CircuitBreaker
from store.gc import GcReport, clear, collect
from store.index import RedisIndex, new_entry, parse_member
from store.interface import CacheHealth, KVBlock, KVSpec, PrefixMatch
from store.ram import RamTier
from store.serde import BlockVerificationError, decode_block, encode_block
from store.stats import SharedStats

log = logging.getLogger(__name__)
T = TypeVar("T")

WARN_EVERY_S = 60.0


@dataclass
class CacheStats:
    """Counters of this process (blocks unless named otherwise)."""

    lookups: int = 0
    blocks_matched: int = 0
    blocks_loaded: int = 0
    blocks_from_ram: int = 0
    verification_failures: int = 0
    blocks_saved: int = 0
    save_errors: int = 0
    saves_dropped: int = 0
    redis_errors: int = 0
    evicted_budget: int = 0
    evicted_ttl: int = 0
    evicted_orphan: int = 0
    evicted_gc: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


def _block_ids(token_ids: Sequence[int], i: int) -> tuple[int, ...]:
    """The 128 token ids of block ``i``."""
    return tuple(token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])


@dataclass(frozen=True)
class _SaveJob:
    namespace: Namespace
    blocks: list[KVBlock]  # consecutive, in chain order
    parent: BlockHash | None  # of the first block
    ttl_s: int
    created: float = field(default_factory=time.time)


class BlockCache:
    """The prefix cache the engine is handed (implements ``store.interface.PrefixCache``).

    Args:
        index: the Redis index.
        blobs: the blob store.
        spec: shape and dtype every block must have.
        ttl_s: default TTL in seconds of new entries, refreshed on every hit.
        max_bytes: budget of the blob store in bytes; least recently used blocks are evicted
            beyond it (checked after every publish, so it is exceeded by at most one block per
            concurrent writer).
        breaker_cooldown_s: how long to skip Redis after it failed.
        max_pending_saves: bound of the background save queue (jobs); beyond it saves are dropped
            and counted, so a slow disk never holds tensors without limit.
        ram_bytes: budget in bytes of the RAM tier of recently used blocks (0: no RAM tier).
    """

    def __init__(
        self,
        index: RedisIndex,
        blobs: BlobStore,
        spec: KVSpec,
        *,
        ttl_s: int,
        max_bytes: int | None = None,
        breaker_cooldown_s: float = 5.0,
        max_pending_saves: int = 64,
        ram_bytes: int = 0,
    ) -> None:
        self.index = index
        self.shared = SharedStats(index.client, index.key_prefix)
        self.blobs = blobs
        self.spec = spec
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self.ram = RamTier(ram_bytes)
        # blocks handed to save() and not yet published (or given up), by (namespace, hash)
        self._pending: dict[tuple[Namespace, BlockHash], KVBlock] = {}
        self._pending_lock = threading.Lock()
        self.breaker = CircuitBreaker(breaker_cooldown_s)
        self._last_warning: dict[str, float] = {}
        # NOTE: one background thread does every write (blobs, index entries, shared counters), so
        # nothing a request does waits on the disk or on a second Redis round trip.
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=max_pending_saves)
        self._writer = threading.Thread(target=self._write_loop, name="kvproxy-saver", daemon=True)
        self._writer.start()

    # -- lookup -------------------------------------------------------------------------------

    def lookup(
        self, namespace: Namespace, token_ids: Sequence[int], max_blocks: int, ttl_s: int | None = None
    ) -> PrefixMatch:
        """See ``PrefixCache.lookup``: one Redis round trip, then read and verify in chain order."""
        self.stats.add(lookups=1)
        match = self._match(namespace, token_ids, max_blocks, ttl_s)
        cached_tokens = min(match.num_tokens, len(token_ids) - 1)
        failures = 1 if match.miss_reason == "failed verification" else 0
        self._share(
            namespace,
            prompt_tokens=len(token_ids),
            cached_tokens=cached_tokens,
            verification_failures=failures,
        )
        return match

    def _match(
        self, namespace: Namespace, token_ids: Sequence[int], max_blocks: int, ttl_s: int | None
    ) -> PrefixMatch:
        hashes = block_hashes(token_ids[: max_blocks * BLOCK_SIZE], namespace)
        if not hashes:
            return PrefixMatch([])
        if not self.breaker.allow():
            return PrefixMatch([], "cache unavailable")
        try:
            entries, seen = self.index.match(namespace, hashes, ttl_s or self.ttl_s)
        except redis.RedisError as exc:
            self._redis_failed("match", exc)
            return PrefixMatch([], "cache unavailable")
        self._redis_ok()
        self.stats.add(blocks_matched=len(entries))
        miss_reason = None if len(entries) == len(hashes) else "expired or evicted" if seen else "never seen"

        blocks: list[KVBlock] = []
        from_ram = 0
        for i in range(len(entries)):
            block_hash = hashes[i]
            ids = _block_ids(token_ids, i)
            block = self.ram.get(namespace, block_hash)
            if block is not None and block.token_ids == ids:
                blocks.append(block)
                from_ram += 1
                continue
            try:
                # NOTE: the path comes from our own hash, never from the index entry, and the
                # blob is verified against our own tokens: a wrong reply can only cause a miss.
                data = self.blobs.read(self.blobs.relative_path(namespace, block_hash))
                block = decode_block(
                    data,
                    index=i,
                    block_hash=block_hash,
                    parent=hashes[i - 1] if i else None,
                    namespace=namespace,
                    token_ids=ids,
                    spec=self.spec,
                )
            except (OSError, BlockVerificationError) as exc:
                # NOTE: the prefix ends at the first block we cannot serve; blocks after it are
                # never loaded, since their K/V depends on this one.
                log.warning("cache block %d (%s) dropped: %s", i, block_hash.hex(), exc)
                self.stats.add(verification_failures=1)
                self._discard(namespace, block_hash)
                miss_reason = "failed verification"
                break
            self.ram.put(namespace, block)
            blocks.append(block)
        if len(blocks) == len(entries):
            # NOTE: blocks this process computed and is still saving extend the prefix the index
            # lists, so a request sent right after another one hits without waiting for the disk.
            with self._pending_lock:
                for i in range(len(blocks), len(hashes)):
                    block = self._pending.get((namespace, hashes[i]))
                    if block is None or block.token_ids != tuple(
                        token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                    ):
                        break
                    blocks.append(block)
                    from_ram += 1
            if len(blocks) == len(hashes):
                miss_reason = None
        self.stats.add(blocks_loaded=len(blocks), blocks_from_ram=from_ram)
        return PrefixMatch(blocks, miss_reason)

    def _discard(self, namespace: Namespace, block_hash: BlockHash) -> None:
        """Remove a block that cannot be served: its index entry, then its blob (so the next save
        writes it afresh)."""
        self.ram.drop(namespace, block_hash)
        try:
            self.index.drop(namespace, block_hash)
        except redis.RedisError as exc:
            self._redis_failed("drop", exc)
        try:
            self.blobs.delete(self.blobs.relative_path(namespace, block_hash))
        except OSError as exc:
            self._warn("delete", "cannot delete bad blob %s: %s", block_hash.hex(), exc)

    # -- save ---------------------------------------------------------------------------------

    def save(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        first_block: int,
        key: torch.Tensor,
        value: torch.Tensor,
        ttl_s: int | None = None,
    ) -> None:
        """See ``PrefixCache.save``: queue the blocks for the background writer.

        Until they are published, this process serves them from memory right after the prefix the
        index lists (a request that follows at once still hits); see ``_match``.
        """
        assert key.shape[2] % BLOCK_SIZE == 0, key.shape
        last = first_block + key.shape[2] // BLOCK_SIZE
        hashes = block_hashes(token_ids[: last * BLOCK_SIZE], namespace)
        pairs = zip(key.split(BLOCK_SIZE, dim=2), value.split(BLOCK_SIZE, dim=2), strict=True)
        blocks = [
            KVBlock(i, hashes[i], _block_ids(token_ids, i), k, v)
            for i, (k, v) in enumerate(pairs, start=first_block)
        ]
        job = _SaveJob(
            namespace, blocks, hashes[first_block - 1] if first_block else None, ttl_s or self.ttl_s
        )
        with self._pending_lock:
            self._pending.update(((namespace, b.block_hash), b) for b in blocks)
        if not self._enqueue(lambda: self._write(job)):
            self._unpend(job.namespace, blocks)
            self.stats.add(saves_dropped=len(blocks))
            self._warn("queue", "save queue full: %d blocks not cached", len(blocks))

    def flush(self, timeout_s: float) -> bool:
        """See ``PrefixCache.flush``."""
        with self._jobs.all_tasks_done:
            return self._jobs.all_tasks_done.wait_for(
                lambda: self._jobs.unfinished_tasks == 0, timeout=timeout_s
            )

    def _enqueue(self, job: Callable[[], None]) -> bool:
        try:
            self._jobs.put_nowait(job)
            return True
        except queue.Full:
            return False

    def _share(self, namespace: Namespace | None = None, **counts: int) -> None:
        """Add to the deployment-wide counters in Redis (and the namespace's), in the background."""
        if self.breaker.allow():
            scope = namespace.hex() if namespace is not None else None
            self._enqueue(lambda: self.guarded("stats", self.shared.add, scope, counts))

    def guarded(self, operation: str, fn: Callable[..., T], *args: object) -> T | None:
        """``fn(*args)``, or None when the breaker is open or Redis fails (which opens it)."""
        if not self.breaker.allow():
            return None
        try:
            return fn(*args)
        except redis.RedisError as exc:
            self._redis_failed(operation, exc)
            return None

    def _write_loop(self) -> None:
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
            self._unpend(job.namespace, job.blocks)

    def _unpend(self, namespace: Namespace, blocks: list[KVBlock]) -> None:
        with self._pending_lock:
            for block in blocks:
                self._pending.pop((namespace, block.block_hash), None)

    def _publish(self, job: _SaveJob) -> None:
        """Write each block's blob, then its index entry (never the reverse); keep it in RAM."""
        if not self.breaker.allow():
            return  # NOTE: a blob that cannot be indexed is never written
        try:
            missing = self.index.missing(job.namespace, [b.block_hash for b in job.blocks])
        except redis.RedisError as exc:
            self._redis_failed("exists", exc)
            return
        parent = job.parent
        for view, needed in zip(job.blocks, missing, strict=True):
            block = dataclasses.replace(view, key=view.key.contiguous(), value=view.value.contiguous())
            block_parent, parent = parent, block.block_hash
            if not needed:
                self.ram.put(job.namespace, block)
                continue
            path = self.blobs.relative_path(job.namespace, block.block_hash)
            data = encode_block(block, job.namespace, block_parent, self.spec)
            try:
                self.blobs.write(path, data)
            except OSError as exc:
                self.stats.add(save_errors=1)
                self._warn(
                    "write",
                    "cannot write block blobs under %s (%s): serving without saving",
                    self.blobs.root,
                    exc,
                )
                return
            try:
                entry = new_entry(path, len(data), block_parent)
                total = self.index.publish(
                    job.namespace, block.block_hash, block_parent, block.index, entry, job.ttl_s, job.created
                )
            except redis.RedisError as exc:
                self._redis_failed("publish", exc)
                return
            self.ram.put(job.namespace, block)
            self.stats.add(blocks_saved=1)
            self._share(job.namespace, blocks_saved=1)
            if total is not None and self.max_bytes is not None and total > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        assert self.max_bytes is not None
        try:
            evicted = self.index.evict(self.max_bytes)
        except redis.RedisError as exc:
            self._redis_failed("evict", exc)
            return
        for member in evicted:
            namespace, block_hash = parse_member(member)
            self.ram.drop(namespace, block_hash)
            self.blobs.delete(self.blobs.relative_path(namespace, block_hash))
        self.stats.add(evicted_budget=len(evicted))
        self._share(None, evicted_budget=len(evicted))

    # -- garbage collection and administration ------------------------------------------------

    def gc(self, grace_s: float = 60.0) -> GcReport | None:
        """Reconcile index and blob store (see ``store.gc``); None when Redis is unreachable."""
        if not self.breaker.allow():
            return None
        try:
            report = collect(self.index, self.blobs, grace_s)
        except redis.RedisError as exc:
            self._redis_failed("gc", exc)
            return None
        counts = {
            "evicted_ttl": report.expired,
            "evicted_orphan": report.orphans,
            "evicted_gc": report.missing_blobs + report.unindexed_blobs,
        }
        self.stats.add(**counts)
        self._share(None, **counts)
        if self.max_bytes is not None and self.index.total_bytes() > self.max_bytes:
            self._evict()
        return report

    def clear(self, namespace_hex: str | None = None) -> int:
        """Remove every block (or one namespace's); see ``store.gc.clear``.

        Raises:
            redis.RedisError: Redis failed.
        """
        self.ram.clear(namespace_hex)
        return clear(self.index, self.blobs, namespace_hex)

    # -- health -------------------------------------------------------------------------------

    def health(self) -> CacheHealth:
        """See ``PrefixCache.health``; pings Redis when the breaker lets a probe through."""
        if not self.breaker.allow():
            return "degraded"
        try:
            self.index.ping()
        except redis.RedisError as exc:
            self._redis_failed("ping", exc)
            return "degraded"
        self._redis_ok()
        return "ok"

    def _redis_failed(self, operation: str, exc: Exception) -> None:
        self.stats.add(redis_errors=1)
        if self.breaker.failure():
            log.warning(
                "Redis index unreachable during %s (%s): serving uncached; caching resumes on its "
                "own when Redis answers. Start Redis or set KVPROXY_REDIS_URL.",
                operation,
                exc,
            )

    def _redis_ok(self) -> None:
        if self.breaker.success():
            log.info("Redis index answers again: caching resumed")

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """Log a warning at most once per ``WARN_EVERY_S`` seconds per kind (one per burst)."""
        now = time.monotonic()
        if now - self._last_warning.get(kind, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._last_warning[kind] = now
            log.warning(message, *args)
