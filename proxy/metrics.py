"""What the server measures: Prometheus metrics (``/metrics``) and the per-request records behind
``/stats`` and the dashboard.

Metric names follow vLLM where one exists: ``kvproxy_prefix_cache_queries_total`` and
``kvproxy_prefix_cache_hits_total`` count *tokens* looked up and found, as vLLM's
``prefix_cache_queries``/``prefix_cache_hits`` do. Label values are bounded: routes, status codes,
hit/partial/miss, eviction reasons, store operations; never prompts, hashes or tenants.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.worker import Engine, PrefillDone
from hashing import BLOCK_SIZE
from store import report
from store.cache import BlockCache

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
KEEP_RECORDS = 20_000


def cache_kind(done: PrefillDone) -> str:
    """``hit`` when every full block of the prompt came from the cache, ``partial`` when some
    did, ``miss`` when none did (a prompt under one block is always a miss)."""
    full = done.prompt_tokens // BLOCK_SIZE
    if done.cached_blocks == 0:
        return "miss"
    return "hit" if done.cached_blocks >= full else "partial"


@dataclass(frozen=True)
class RequestRecord:
    """One answered request, as the stats see it (kept in memory, this process only)."""

    at: float  # Unix time of the first token
    namespace: str  # hex: the tenant's cache namespace
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    kind: str
    reason: str | None
    prefill_s: float
    saved_s: float


class Metrics:
    """The metrics of one app (its own Prometheus registry, so several apps can share a process)."""

    def __init__(self, engine: Engine, cache: BlockCache | None) -> None:
        self.engine, self.cache = engine, cache
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvproxy_requests",
            "HTTP requests by route and status code",
            ["route", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "kvproxy_time_to_first_token_seconds",
            "Seconds from request arrival to its first token, by cache outcome",
            ["cache"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.prefill_seconds = Counter(
            "kvproxy_prefill_seconds",
            "Seconds spent loading cached blocks and prefilling prompts",
            registry=self.registry,
        )
        self.prefill_saved = Counter(
            "kvproxy_prefill_seconds_saved",
            "Estimated prefill seconds saved: cached tokens x measured seconds per prefilled token",
            registry=self.registry,
        )
        self.registry.register(_EngineAndStoreCollector(engine, cache))
        self.records: deque[RequestRecord] = deque(maxlen=KEEP_RECORDS)
        self._seconds_per_token: float | None = None
        self._lock = threading.Lock()

    def observe(self, namespace_hex: str, done: PrefillDone, started: float, reason: str | None) -> None:
        """Record a request whose first token is out now; ``started`` is its arrival (monotonic)."""
        ttft = time.monotonic() - started
        kind = cache_kind(done)
        prefilled = done.prompt_tokens - done.cached_tokens
        with self._lock:
            if prefilled >= 32:  # NOTE: short prefills are dominated by overheads, not per-token cost
                rate = done.prefill_s / prefilled
                previous = self._seconds_per_token
                self._seconds_per_token = rate if previous is None else 0.8 * previous + 0.2 * rate
            saved = done.cached_tokens * (self._seconds_per_token or 0.0)
            self.records.append(
                RequestRecord(
                    time.time(),
                    namespace_hex,
                    done.prompt_tokens,
                    done.cached_tokens,
                    ttft,
                    kind,
                    reason,
                    done.prefill_s,
                    saved,
                )
            )
        self.ttft.labels(kind).observe(ttft)
        self.prefill_seconds.inc(done.prefill_s)
        self.prefill_saved.inc(saved)

    def summary(self, namespace_hex: str | None) -> dict[str, Any]:
        """This process's figures for one namespace (a tenant) or all: totals, hit rate over the
        last minute and hour, TTFT p50/p95 by cache outcome, and the recent misses."""
        now = time.time()
        with self._lock:
            mine = [r for r in self.records if namespace_hex is None or r.namespace == namespace_hex]

        def window(seconds: float) -> dict[str, Any]:
            rs = [r for r in mine if r.at >= now - seconds]
            queried, hit = sum(r.prompt_tokens for r in rs), sum(r.cached_tokens for r in rs)
            return {
                "queried_tokens": queried,
                "hit_tokens": hit,
                "hit_rate": hit / queried if queried else None,
            }

        def ttft(kind: str) -> dict[str, Any]:
            values = sorted(r.ttft_s for r in mine if r.kind == kind and r.at >= now - 3600)
            if not values:
                return {"count": 0, "p50": None, "p95": None}
            p95 = statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]
            return {"count": len(values), "p50": statistics.median(values), "p95": p95}

        misses = [r for r in mine if r.kind != "hit"][-20:]
        return {
            "requests": len(mine),
            "prompt_tokens": sum(r.prompt_tokens for r in mine),
            "cached_tokens": sum(r.cached_tokens for r in mine),
            "prefill_seconds": sum(r.prefill_s for r in mine),
            "prefill_seconds_saved": sum(r.saved_s for r in mine),
            "last_minute": window(60),
            "last_hour": window(3600),
            "ttft_seconds": {kind: ttft(kind) for kind in ("hit", "partial", "miss")},
            "recent_misses": [
                {
                    "at": r.at,
                    "prompt_tokens": r.prompt_tokens,
                    "cached_tokens": r.cached_tokens,
                    "cache": r.kind,
                    "reason": r.reason,
                }
                for r in reversed(misses)
            ],
        }


class _EngineAndStoreCollector(Collector):
    """Reads the engine's and the cache's own counters at scrape time."""

    def __init__(self, engine: Engine, cache: BlockCache | None) -> None:
        self.engine, self.cache = engine, cache

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e = self.engine.stats
        yield CounterMetricFamily(
            "kvproxy_prompt_tokens", "Prompt tokens of answered requests", value=e.prompt_tokens
        )
        yield CounterMetricFamily(
            "kvproxy_prefill_tokens", "Prompt tokens computed (not from the cache)", value=e.prefill_tokens
        )
        queries = e.prompt_tokens if self.cache is not None else 0
        yield CounterMetricFamily(
            "kvproxy_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", value=queries
        )
        yield CounterMetricFamily(
            "kvproxy_prefix_cache_hits", "Prompt tokens served from the prefix cache", value=e.cached_tokens
        )
        yield GaugeMetricFamily(
            "kvproxy_engine_queue_depth", "Requests waiting for the engine", value=self.engine.queue_depth
        )
        yield GaugeMetricFamily(
            "kvproxy_engine_running", "Requests being prefilled or decoded", value=self.engine.running
        )
        if self.cache is None:
            return
        s = self.cache.stats
        yield CounterMetricFamily(
            "kvproxy_cache_blocks_stored", "Blocks written to the cache", value=s.blocks_saved
        )
        yield CounterMetricFamily(
            "kvproxy_cache_blocks_loaded", "Blocks loaded and verified", value=s.blocks_loaded
        )
        yield CounterMetricFamily(
            "kvproxy_cache_ram_tier_hits", "Blocks served from the RAM tier", value=s.blocks_from_ram
        )
        yield GaugeMetricFamily(
            "kvproxy_cache_ram_tier_bytes", "K/V bytes held in the RAM tier", value=self.cache.ram.used_bytes
        )
        yield _by_label(
            "kvproxy_cache_blocks_evicted",
            "Blocks removed, by reason",
            "reason",
            [
                ("ttl", s.evicted_ttl),
                ("budget", s.evicted_budget),
                ("verification_failure", s.verification_failures),
                ("gc", s.evicted_gc + s.evicted_orphan),
            ],
        )
        yield _by_label(
            "kvproxy_cache_store_errors",
            "Cache store errors by operation",
            "operation",
            [("redis", s.redis_errors), ("write", s.save_errors), ("queue_full", s.saves_dropped)],
        )
        held = report.stored(self.cache)
        yield GaugeMetricFamily(
            "kvproxy_redis_up", "1 when the Redis index answers", value=0 if held is None else 1
        )
        if held is not None:
            yield GaugeMetricFamily("kvproxy_cache_blocks", "Blocks in the cache", value=held[0])
            yield GaugeMetricFamily("kvproxy_cache_blob_bytes", "Bytes in the blob store", value=held[1])


def _by_label(name: str, doc: str, label: str, values: list[tuple[str, int]]) -> CounterMetricFamily:
    """A counter with one sample per ``(label value, count)``."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for label_value, count in values:
        family.add_metric([label_value], count)
    return family


class RequestMetrics:
    """ASGI middleware: stamps each request's arrival (for TTFT) and counts responses by route
    template and status code."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["started"] = time.monotonic()

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics: Metrics | None = getattr(scope["app"].state, "metrics", None)
                route = getattr(scope.get("route"), "path", "unmatched")
                if metrics is not None:
                    metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
