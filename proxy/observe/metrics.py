"""What the server measures: Prometheus metrics (``/metrics``), and the per-request records behind
``/stats`` and the dashboard (``proxy.observe.records``).

Metric names follow vLLM's meaning where one exists: ``kvproxy_prefix_cache_queries_total`` and
``kvproxy_prefix_cache_hits_total`` count *tokens* looked up and found, as vLLM's
``prefix_cache_queries``/``prefix_cache_hits`` do; the vLLM-named series themselves are in
``proxy.observe.vllm_metrics``. Label values are bounded: routes, status codes,
``CacheKind``, ``EvictionReason``, store operations; never prompts, hashes or tenants.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.requests import Finished, PrefillDone
from engine.worker import Engine
from proxy.observe.audits import AuditReport
from proxy.observe.records import RequestLog, RequestRecord
from proxy.observe.vllm_metrics import VllmMetrics
from store.admin_interface import CacheAdmin

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The metrics of one app (its own Prometheus registry, so several apps can share a process)."""

    def __init__(self, engine: Engine, cache: CacheAdmin | None) -> None:
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
        self.vllm = VllmMetrics(self.registry, engine, engine.loaded.served_names[0], cache is not None)
        self.audits = AuditReport(self.registry, engine)
        self.log = RequestLog()
        self._seconds_per_token: float | None = None
        self._lock = threading.Lock()

    def observe(self, namespace_hex: str, done: PrefillDone, started: float) -> float:
        """Record a request whose first token is out now; ``started`` is its arrival (monotonic
        seconds). Returns its TTFT in seconds."""
        ttft = time.monotonic() - started
        prefilled = done.prompt_tokens - done.cached_tokens
        with self._lock:
            if prefilled >= 32:  # NOTE: short prefills are dominated by overheads, not per-token cost
                rate = done.prefill_s / prefilled
                previous = self._seconds_per_token
                self._seconds_per_token = rate if previous is None else 0.8 * previous + 0.2 * rate
            saved = done.cached_tokens * (self._seconds_per_token or 0.0)
        record = RequestRecord(
            time.time(),
            namespace_hex,
            done.prompt_tokens,
            done.cached_tokens,
            ttft,
            done.kind,
            done.first_miss[1],
            done.prefill_s,
            saved,
        )
        self.log.add(record)
        self.ttft.labels(done.kind).observe(ttft)
        self.prefill_seconds.inc(done.prefill_s)
        self.prefill_saved.inc(saved)
        self.vllm.prefilled(done, ttft)
        return ttft

    def finished(self, namespace_hex: str, finished: Finished, started: float, ttft_s: float) -> None:
        """Record a finished request of ``namespace_hex`` that arrived at ``started`` (monotonic
        seconds)."""
        self.vllm.finished(finished, ttft_s, time.monotonic() - started)
        if finished.draft_tokens:
            self.log.drafted(namespace_hex, finished.draft_tokens, finished.accepted_tokens)


class _EngineAndStoreCollector(Collector):
    """Reads the engine's and the cache's own counters at scrape time."""

    def __init__(self, engine: Engine, cache: CacheAdmin | None) -> None:
        self.engine, self.cache = engine, cache

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e = self.engine.stats()
        queries = e.prompt_tokens if self.cache is not None else 0
        yield CounterMetricFamily(
            "kvproxy_prompt_tokens", "Prompt tokens of answered requests", value=e.prompt_tokens
        )
        yield CounterMetricFamily(
            "kvproxy_prefill_tokens", "Prompt tokens computed (not from the cache)", value=e.prefill_tokens
        )
        yield CounterMetricFamily(
            "kvproxy_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", value=queries
        )
        yield CounterMetricFamily(
            "kvproxy_prefix_cache_hits", "Prompt tokens served from the prefix cache", value=e.cached_tokens
        )
        yield CounterMetricFamily("kvproxy_decode_steps", "Batched decode steps run", value=e.decode_steps)
        yield CounterMetricFamily(
            "kvproxy_decode_step_seconds",
            "Seconds inside decode steps (the forward pass only, not sampling or streaming)",
            value=e.decode_step_seconds,
        )
        yield CounterMetricFamily(
            "kvproxy_draft_tokens",
            "Tokens drafted for speculative decoding and checked in decode steps",
            value=e.draft_tokens,
        )
        yield CounterMetricFamily(
            "kvproxy_draft_accepted_tokens",
            "Drafted tokens the model's own choice confirmed (decoded without a step of their own)",
            value=e.accepted_tokens,
        )
        yield GaugeMetricFamily(
            "kvproxy_engine_queue_depth", "Requests waiting for the engine", value=self.engine.queue_depth
        )
        yield GaugeMetricFamily(
            "kvproxy_engine_running", "Requests being prefilled or decoded", value=self.engine.running
        )
        yield CounterMetricFamily(
            "kvproxy_audit_dropped",
            "Hits sampled for the audit but never audited (too many were waiting for idle time)",
            value=self.engine.audits_dropped,
        )
        if self.cache is None:
            return
        s = self.cache.stats()
        yield CounterMetricFamily(
            "kvproxy_cache_blocks_stored", "Blocks written to the cache", value=s.blocks_saved
        )
        yield CounterMetricFamily(
            "kvproxy_cache_tails_stored", "Tails (hashing.tails) written to the cache", value=s.tails_saved
        )
        yield CounterMetricFamily(
            "kvproxy_cache_tail_stored_bytes",
            "Bytes of the tails written to the cache",
            value=s.tail_bytes_saved,
        )
        yield CounterMetricFamily(
            "kvproxy_cache_blocks_loaded", "Blocks loaded and verified", value=s.blocks_loaded
        )
        yield CounterMetricFamily("kvproxy_cache_tail_hits", "Lookups a tail extended", value=s.tails_hit)
        yield CounterMetricFamily(
            "kvproxy_cache_tail_hit_tokens",
            "Prompt tokens tails served (part of the hits)",
            value=s.tail_tokens_hit,
        )
        yield CounterMetricFamily(
            "kvproxy_cache_ram_tier_hits", "Blocks served from the RAM tier", value=s.blocks_from_ram
        )
        yield GaugeMetricFamily(
            "kvproxy_cache_ram_tier_bytes", "K/V bytes held in the RAM tier", value=s.ram_tier_bytes
        )
        yield _by_label("kvproxy_cache_blocks_evicted", "Blocks removed, by reason", "reason", s.evictions)
        imports = {"confirmed": s.imports_confirmed, "rejected": s.imports_rejected}
        yield _by_label(
            "kvproxy_import_audits",
            "Imported blocks audited (--audit-imports), by outcome",
            "outcome",
            imports,
        )
        errors = {
            "redis": s.redis_errors,
            "write": s.save_errors,
            "queue_full": s.saves_dropped,
            "read_timeout": s.read_timeouts,
            "read": s.read_errors,
        }
        yield _by_label("kvproxy_cache_store_errors", "Cache store errors by operation", "operation", errors)
        held = self.cache.usage()
        yield GaugeMetricFamily(
            "kvproxy_redis_up", "1 when the Redis index answers", value=0 if held is None else 1
        )
        if held is not None:
            yield GaugeMetricFamily(
                "kvproxy_cache_blocks",
                "Blocks in the cache, tails (the tokens after a prompt's last full block) included",
                value=held[0],
            )
            yield GaugeMetricFamily("kvproxy_cache_blob_bytes", "Bytes in the blob store", value=held[1])


def _by_label(name: str, doc: str, label: str, values: Mapping[Any, int]) -> CounterMetricFamily:
    """A counter with one sample per ``{label value: count}``."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for label_value, count in values.items():
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

        started = False

        def count(status: int) -> None:
            metrics: Metrics | None = getattr(scope["app"].state, "metrics", None)
            if metrics is not None:
                metrics.requests.labels(getattr(scope.get("route"), "path", "unmatched"), str(status)).inc()

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # NOTE: the outermost handler answers 500 after this middleware
                count(500)
            raise
