"""This process's cache statistics: one value type (``CacheStats``), the thread-safe recorder that
produces snapshots of it, and the report of one garbage collection.

Deployment-wide totals, summed over every process sharing the index, live in Redis
(``store.index.redis.counters``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

from store.outcomes import EvictionReason

if TYPE_CHECKING:
    from store.interface import KVBlock


@dataclass(frozen=True)
class CacheStats:
    """Counters of this process since it started (blocks unless named otherwise).

    Attributes:
        lookups: prefix lookups.
        tokens_queried, tokens_hit: prompt tokens looked up, and of those served from the cache
            (``min(128 k, n - 1)`` per lookup, as reported in ``cached_tokens``).
        blocks_matched: blocks the index listed; ``blocks_loaded`` of them verified and served,
            ``blocks_from_ram`` of those without reading a blob (RAM tier or still being saved).
        verification_failures: blobs that were missing, unreadable or wrong (then dropped).
        read_timeouts: lookups cut short because a blob read took too long.
        read_errors: lookups cut short because a blob could not be read (an I/O error; the blob
            is kept).
        tails_hit, tail_tokens_hit: lookups a tail extended (``hashing.tails``), and the tokens
            the tails served (part of ``tokens_hit``).
        blocks_saved, save_errors, saves_dropped: blocks written; writes that failed; blocks not
            saved because the writer's queue was full.
        tails_saved, tail_bytes_saved: tails written, and their blobs' bytes.
        redis_errors: Redis operations that failed or timed out.
        evicted_budget, evicted_ttl, evicted_orphan, evicted_gc, evicted_audit: blocks removed by
            this process, by cause (see ``EvictionReason``).
        imports_confirmed, imports_rejected: imported blocks whose audit (``--audit-imports``)
            found them equal to the engine's own computation (then served), or not (removed).
        encoded_bytes, encoded_blob_bytes, encode_us: K/V bytes encoded into blobs (in the model's
            dtype), the blobs' bytes, and the microseconds that took (``store.codec``: the block
            format's arrays, packed); ``decoded_bytes``, ``decoded_blob_bytes``, ``decode_us``
            the same for blobs read, verified and unpacked.
        ram_tier_bytes: K/V bytes held in the RAM tier now (a gauge).
    """

    lookups: int = 0
    tokens_queried: int = 0
    tokens_hit: int = 0
    blocks_matched: int = 0
    blocks_loaded: int = 0
    blocks_from_ram: int = 0
    verification_failures: int = 0
    read_timeouts: int = 0
    read_errors: int = 0
    tails_hit: int = 0
    tail_tokens_hit: int = 0
    blocks_saved: int = 0
    tails_saved: int = 0
    tail_bytes_saved: int = 0
    save_errors: int = 0
    saves_dropped: int = 0
    redis_errors: int = 0
    evicted_budget: int = 0
    evicted_ttl: int = 0
    evicted_orphan: int = 0
    evicted_gc: int = 0
    evicted_audit: int = 0
    imports_confirmed: int = 0
    imports_rejected: int = 0
    encoded_bytes: int = 0
    encoded_blob_bytes: int = 0
    encode_us: int = 0
    decoded_bytes: int = 0
    decoded_blob_bytes: int = 0
    decode_us: int = 0
    ram_tier_bytes: int = 0

    @property
    def hit_rate(self) -> float | None:
        """Share of queried prompt tokens served from the cache; None before any lookup."""
        return self.tokens_hit / self.tokens_queried if self.tokens_queried else None

    @property
    def evictions(self) -> dict[EvictionReason, int]:
        """Blocks removed, by reason (the labels of ``kvproxy_cache_blocks_evicted_total``)."""
        return {
            "ttl": self.evicted_ttl,
            "budget": self.evicted_budget,
            "verification_failure": self.verification_failures,
            "gc": self.evicted_gc + self.evicted_orphan,
            "audit": self.evicted_audit + self.imports_rejected,
        }

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StatsRecorder:
    """Adds to the counters of ``CacheStats`` from any thread; ``snapshot`` reads them all at once."""

    def __init__(self) -> None:
        self._counts = dict.fromkeys((f.name for f in fields(CacheStats)), 0)
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        """Add to named counters, e.g. ``add(blocks_saved=1)``.

        Raises:
            KeyError: an unknown counter (a bug).
        """
        with self._lock:
            for name, delta in deltas.items():
                if name not in self._counts:
                    raise KeyError(name)
                self._counts[name] += delta

    def add_coded(
        self, kind: Literal["encode", "decode"], block: KVBlock, blob_bytes: int, seconds: float
    ) -> None:
        """Count ``block`` encoded into or decoded from a blob of ``blob_bytes`` bytes in ``seconds``."""
        kv = block.key.nbytes + block.value.nbytes
        self.add(
            **{f"{kind}d_bytes": kv, f"{kind}d_blob_bytes": blob_bytes, f"{kind}_us": int(seconds * 1e6)}
        )

    def snapshot(self, **gauges: int) -> CacheStats:
        """The counters now, with ``gauges`` (e.g. ``ram_tier_bytes``) set as given."""
        with self._lock:
            return CacheStats(**(self._counts | gauges))


@dataclass
class GcReport:
    """What one garbage collection removed (blocks) and freed (bytes of blobs); filled in as the
    collection goes."""

    expired: int = 0
    orphans: int = 0
    missing_blobs: int = 0
    unindexed_blobs: int = 0
    temp_files: int = 0
    bytes_freed: int = 0
