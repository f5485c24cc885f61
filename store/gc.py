"""The garbage collector: make the index and the blob store agree again.

What it reclaims, and why each can exist:
- **expired**: an index entry's TTL ran out (Redis deleted it); its LRU member, size record and
  blob remain until collected.
- **orphan**: an entry whose parent entry is gone (a tail's parent is its tip). Lookups stop at
  the first missing block, so it can never be served; it only holds storage.
- **expired tail listings** (``BlockIndex.prune_tails``), after tips no lookup reads again.
- **missing blob**: an entry whose blob was deleted outside kvproxy.
- **unindexed blob**: a blob no entry accounts for (Redis restarted empty, a publish failed, a
  writer crashed). Only after ``grace_s`` seconds, so a blob written but not yet published is safe.

Every blob access goes through ``BlobBackend`` (a directory or a bucket); unindexed blobs are found
by listing (``scan``). Nothing here depends on Redis keyspace notifications; running it in several
processes at once is safe (every index change is an atomic script; deleting a blob twice is
harmless). ``GarbageCollector`` runs it on a timer. Beside it, ``evict_to_budget``: the byte
budget's least-recently-used eviction, which the writer runs after a publish that went over it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hashing import Namespace
from store.background import yield_to_requests
from store.blobs.base import BlobBackend, BlobInfo
from store.entries import member_name, parse_member
from store.index.base import BlockIndex
from store.parts import StoreParts
from store.stats import GcReport

log = logging.getLogger(__name__)

BATCH = 1000


def collect(index: BlockIndex, blobs: BlobBackend, grace_s: float) -> GcReport:
    """One pass over the index, then over the blob store.

    Raises:
        redis.RedisError: Redis failed; whatever was reclaimed so far stays reclaimed.
        OSError: the blob store failed; likewise.
    """
    tally = GcReport()
    # NOTE: removing an orphan orphans its children: repeat until a pass finds none.
    for _ in range(64):
        orphans_before = tally.orphans
        _collect_index(index, blobs, tally)
        if tally.orphans == orphans_before:
            break
    index.prune_tails()
    _collect_blobs(index, blobs, grace_s, tally)
    return tally


def _collect_index(index: BlockIndex, blobs: BlobBackend, tally: GcReport) -> None:
    for members in index.members(BATCH):
        entries = index.entries(members)
        gone = [m for m, e in zip(members, entries, strict=True) if e is None]
        tally.expired += len(_forget(index, blobs, gone, force=False, tally=tally))

        alive = [m for m, e in zip(members, entries, strict=True) if e is not None]
        no_blob = [m for m in alive if not blobs.exists(*parse_member(m))]
        tally.missing_blobs += len(_forget(index, blobs, no_blob, force=True, tally=tally))

        with_parent = [
            (m, e)
            for m, e in zip(members, entries, strict=True)
            if e is not None and e.parent and m not in no_blob
        ]
        parents = [f"{m.split(':')[0]}:b:{e.parent}" for m, e in with_parent]
        parent_entries = index.entries(parents)
        orphans = [m for (m, _), p in zip(with_parent, parent_entries, strict=True) if p is None]
        tally.orphans += len(_forget(index, blobs, orphans, force=True, tally=tally))


def _collect_blobs(index: BlockIndex, blobs: BlobBackend, grace_s: float, tally: GcReport) -> None:
    old = [b for b in blobs.scan() if b.age_s > grace_s]
    for temp in [b for b in old if b.block_hash is None]:
        blobs.remove(temp)
        tally.temp_files += 1
        tally.bytes_freed += temp.size
    candidates = [b for b in old if b.block_hash is not None]
    for start in range(0, len(candidates), BATCH):
        batch = candidates[start : start + BATCH]
        for blob, is_known in zip(batch, index.known([_member(b) for b in batch]), strict=True):
            if not is_known:
                blobs.remove(blob)
                tally.unindexed_blobs += 1
                tally.bytes_freed += blob.size


def _member(blob: BlobInfo) -> str:
    assert blob.block_hash is not None
    return member_name(Namespace(bytes.fromhex(blob.namespace_hex)), blob.block_hash)


def _forget(
    index: BlockIndex, blobs: BlobBackend, members: list[str], *, force: bool, tally: GcReport
) -> list[str]:
    """Reclaim ``members`` in the index, then delete their blobs."""
    removed = index.reclaim(members, force=force)
    for member in removed:
        namespace, block_hash = parse_member(member)
        tally.bytes_freed += blobs.size(namespace, block_hash) or 0
        blobs.delete(namespace, block_hash)
    return removed


def clear(index: BlockIndex, blobs: BlobBackend, namespace_hex: str | None = None) -> int:
    """Remove every block (or every block of one namespace) from the index and the blob store.

    Returns:
        How many indexed blocks were removed (blobs without entries are removed too).

    Raises:
        redis.RedisError: Redis failed.
        OSError: the blob store failed.
    """
    tally = GcReport()
    removed = 0
    for members in index.members(BATCH):
        chosen = [m for m in members if namespace_hex is None or m.startswith(f"{namespace_hex}:")]
        removed += len(_forget(index, blobs, chosen, force=True, tally=tally))
    for blob in list(blobs.scan(namespace_hex)):
        blobs.remove(blob)
    return removed


class GarbageCollector:
    """Runs ``collect_once()`` every ``interval_s`` seconds on a daemon thread until stopped."""

    def __init__(self, collect_once: Callable[[], object], interval_s: float) -> None:
        self._collect_once, self.interval_s = collect_once, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvproxy-gc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        yield_to_requests()
        while not self._stop.wait(self.interval_s):
            try:
                self._collect_once()
            except OSError as exc:
                log.warning("garbage collection failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def evict_to_budget(parts: StoreParts, max_bytes: int, namespace_max_bytes: int | None = None) -> int:
    """Evict least recently used blocks (index entry, RAM tier, blob) until the blob store holds at
    most ``max_bytes`` bytes, those of a namespace past ``namespace_max_bytes`` first (a tenant's
    share); returns how many were evicted (0 when Redis failed: the guard counted it)."""
    evicted = parts.guard.redis("evict", parts.index.evict, max_bytes, namespace_max_bytes) or []
    for member in evicted:
        namespace, block_hash = parse_member(member)
        parts.ram.drop(namespace, block_hash)
        try:
            parts.blobs.delete(namespace, block_hash)
        except OSError as exc:  # unindexed now: the collector removes it later
            parts.guard.warn("evict", "cannot delete an evicted blob from %s (%s)", parts.blobs.url, exc)
    if evicted:
        parts.recorder.add(evicted_budget=len(evicted))
    return len(evicted)
