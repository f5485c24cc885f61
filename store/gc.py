"""The garbage collector: make the index and the blob store agree again.

What it reclaims, and why each can exist:
- **expired**: an index entry's TTL ran out (Redis deleted it); its LRU member, size record and
  blob remain until collected.
- **orphan**: an entry whose parent entry is gone. Lookups stop at the first missing block, so it
  can never be served; it only holds disk.
- **missing blob**: an entry whose blob file was deleted outside kvproxy.
- **unindexed blob**: a file no entry accounts for (Redis restarted empty, a publish failed, a
  writer crashed). Only after ``grace_s`` seconds, so a blob written but not yet published is safe.

Nothing here depends on Redis keyspace notifications; running it in several processes at once is
safe (every index change is an atomic script; deleting a file twice is harmless).
"""

from __future__ import annotations

from dataclasses import dataclass

from store.blobs import BlobStore
from store.index import RedisIndex, parse_member


@dataclass
class GcReport:
    """What one collection removed (blocks) and freed (bytes on disk)."""

    expired: int = 0
    orphans: int = 0
    missing_blobs: int = 0
    unindexed_blobs: int = 0
    temp_files: int = 0
    bytes_freed: int = 0


def collect(index: RedisIndex, blobs: BlobStore, grace_s: float) -> GcReport:
    """One pass over the index, then over the blob directory.

    Raises:
        redis.RedisError: Redis failed; whatever was reclaimed so far stays reclaimed.
    """
    report = GcReport()
    # NOTE: removing an orphan orphans its children: repeat until a pass finds none.
    for _ in range(64):
        orphans_before = report.orphans
        _collect_index(index, blobs, report)
        if report.orphans == orphans_before:
            break
    _collect_files(index, blobs, grace_s, report)
    return report


def _collect_index(index: RedisIndex, blobs: BlobStore, report: GcReport) -> None:
    for members in index.members():
        entries = index.entries(members)
        gone = [m for m, e in zip(members, entries, strict=True) if e is None]
        report.expired += len(_forget(index, blobs, gone, force=False, report=report))

        alive = [(m, e) for m, e in zip(members, entries, strict=True) if e is not None]
        no_blob = [m for m, e in alive if not (blobs.root / e.blob).exists()]
        report.missing_blobs += len(_forget(index, blobs, no_blob, force=True, report=report))

        with_parent = [(m, e) for m, e in alive if e.parent and m not in no_blob]
        parents = [f"{m.split(':')[0]}:b:{e.parent}" for m, e in with_parent]
        parent_entries = index.entries(parents)
        orphans = [m for (m, _), p in zip(with_parent, parent_entries, strict=True) if p is None]
        report.orphans += len(_forget(index, blobs, orphans, force=True, report=report))


def _collect_files(index: RedisIndex, blobs: BlobStore, grace_s: float, report: GcReport) -> None:
    files = [f for f in blobs.scan() if f.age_s > grace_s]
    for f in [f for f in files if f.member is None]:
        f.path.unlink(missing_ok=True)
        report.temp_files += 1
        report.bytes_freed += f.size
    candidates = [f for f in files if f.member is not None]
    for start in range(0, len(candidates), 1000):
        batch = candidates[start : start + 1000]
        known = index.known([f.member for f in batch if f.member])
        for f, is_known in zip(batch, known, strict=True):
            if not is_known:
                f.path.unlink(missing_ok=True)
                report.unindexed_blobs += 1
                report.bytes_freed += f.size
    blobs.remove_empty_dirs()


def _forget(
    index: RedisIndex, blobs: BlobStore, members: list[str], *, force: bool, report: GcReport
) -> list[str]:
    """Reclaim ``members`` in the index, then delete their blobs."""
    removed = index.reclaim(members, force=force)
    for member in removed:
        path = blobs.root / blobs.relative_path(*parse_member(member))
        try:
            report.bytes_freed += path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            pass
    return removed


def clear(index: RedisIndex, blobs: BlobStore, namespace_hex: str | None = None) -> int:
    """Remove every block (or every block of one namespace) from the index and the disk.

    Returns:
        How many indexed blocks were removed (files without entries are removed too).

    Raises:
        redis.RedisError: Redis failed.
    """
    report = GcReport()
    removed = 0
    for members in index.members():
        chosen = [m for m in members if namespace_hex is None or m.startswith(f"{namespace_hex}:")]
        removed += len(_forget(index, blobs, chosen, force=True, report=report))
    for f in blobs.scan():
        if namespace_hex is None or f.path.parent.parent.name == namespace_hex:
            f.path.unlink(missing_ok=True)
    blobs.remove_empty_dirs()
    return removed
