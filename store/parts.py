"""The parts one cache's components share, made once: ``StoreParts``, and the knobs of a serving
cache, ``CacheOptions``.

The lookup, the writer and the administrative side (``store.lookup``, ``store.writer``,
``store.admin``) each hold the same ``StoreParts``, so one Redis failure anywhere opens the
breaker for all of them and every statistic lands in one recorder.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from store.blobs.base import BlobBackend
from store.guard import Guard
from store.index.base import BlockIndex, Counters, HotPrefixes
from store.index.redis.faults import RedisPlace
from store.ram import RamTier
from store.stats import StatsRecorder


@dataclass(frozen=True)
class CacheOptions:
    """How a serving cache behaves (each a ``kvproxy serve`` setting).

    Attributes:
        ttl_s: default TTL in seconds of new entries, refreshed on every hit.
        max_bytes: budget of the blob store in bytes (None: none); least recently used blocks are
            evicted beyond it.
        namespace_max_bytes: one namespace's (a tenant's) share of ``max_bytes``: beyond the
            budget, a namespace holding more gives up its own blocks first (None: no share).
        breaker_cooldown_s: how long to skip Redis after it failed.
        max_pending_saves: bound of the background writer's queue (jobs).
        ram_bytes: budget in bytes of the RAM tier of recently used blocks (0: no RAM tier).
        read_timeout_s: most seconds a lookup waits for blob reads before serving a shorter
            prefix (a stuck disk or mount becomes a miss).
        gc_grace_s: seconds a blob without an index entry is kept before collection.
        pin_memory: keep blocks read from blobs in page-locked memory (for a model on an
            accelerator: uploads are then asynchronous).
        tails: keep and serve tails (``hashing.tails``) beside blocks.
        redis: the index's Redis as its warnings name it (URL, timeout).
    """

    ttl_s: int = 3600
    max_bytes: int | None = None
    namespace_max_bytes: int | None = None
    breaker_cooldown_s: float = 5.0
    max_pending_saves: int = 64
    ram_bytes: int = 0
    read_timeout_s: float = 5.0
    gc_grace_s: float = 60.0
    pin_memory: bool = False
    tails: bool = True
    redis: RedisPlace = field(default_factory=RedisPlace)


@dataclass(frozen=True)
class StoreParts:
    """The index, the blob store, the RAM tier and what meets their faults and counts their work.

    Attributes:
        guard: the index's circuit breaker (and rate-limited warnings).
        stats_guard: the deployment-wide counters' own breaker.
        recorder: this process's statistics (``CacheStats``).
        counters: the deployment-wide counters kept beside the index.
        hot: the hot prefixes kept beside the index.
    """

    index: BlockIndex
    blobs: BlobBackend
    ram: RamTier
    guard: Guard
    stats_guard: Guard
    recorder: StatsRecorder
    counters: Counters
    hot: HotPrefixes

    @classmethod
    def open(
        cls,
        index: BlockIndex,
        blobs: BlobBackend,
        *,
        ram_bytes: int = 0,
        cooldown_s: float = 5.0,
        redis: RedisPlace | None = None,
    ) -> StoreParts:
        """The parts of a cache on ``index`` and ``blobs``, with a RAM tier of ``ram_bytes``
        bytes and breakers that skip Redis for ``cooldown_s`` seconds after a failure (their
        warnings naming ``redis``)."""
        recorder, warned = StatsRecorder(), dict[str, float]()
        # NOTE: the deployment-wide counters have a breaker of their own: on a Redis Cluster they
        # may live on another node than a namespace's blocks, whose lookups must not stop with them.
        # Their warnings are one with the index's: a Redis that is down is said to be once.
        return cls(
            index,
            blobs,
            RamTier(ram_bytes),
            Guard(cooldown_s, recorder, redis, warned),
            Guard(cooldown_s, recorder, redis, warned),
            recorder,
            index.shared_counters(),
            index.hot_prefixes(),
        )
