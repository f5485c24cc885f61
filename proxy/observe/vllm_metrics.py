"""The vLLM-named Prometheus series, beside the ``kvproxy_*`` ones, so that Grafana dashboards
made for vLLM and load-balancing gateways that scrape vLLM (queue depth, KV usage, prefix hits)
read kvproxy unchanged.

Source: vLLM's metrics design (``docs/design/metrics.md``) and ``vllm/v1/metrics/loggers.py``:
names with the ``vllm:`` prefix and a ``model_name`` label; ``prefix_cache_queries`` and
``prefix_cache_hits`` count prompt *tokens* looked up and found. Each value moves by exactly a
response's usage: ``prompt_tokens``, ``generation_tokens`` (``completion_tokens``) and
``prefix_cache_hits`` (``cached_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.requests import Finished, PrefillDone
from engine.worker import Engine

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
TOKEN_COUNT_BUCKETS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class VllmMetrics:
    """vLLM's request and token series for one served model, in ``registry``.

    Args:
        model_name: the ``model_name`` label (the first served name).
        caching: whether prompts are looked up in the prefix cache (``--no-cache`` counts no
            queries).
    """

    def __init__(self, registry: CollectorRegistry, engine: Engine, model_name: str, caching: bool) -> None:
        self.caching = caching

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ["model_name", *labels], registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of answered requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens")
        self.queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.hits = counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache")
        self.success = counter("vllm:request_success", "Finished requests by reason", "finished_reason")
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Seconds to the first token", LATENCY_BUCKETS
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Mean seconds per output token after the first, one sample per request",
            TOKEN_GAP_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Seconds from arrival to the last token", LATENCY_BUCKETS
        )
        self.request_prompt = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request", TOKEN_COUNT_BUCKETS
        )
        self.request_generation = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", TOKEN_COUNT_BUCKETS
        )
        self.label = model_name
        registry.register(_SchedulerCollector(engine, model_name))

    def prefilled(self, done: PrefillDone, ttft_s: float) -> None:
        """Count a request whose first token came ``ttft_s`` seconds after its arrival."""
        self.prompt_tokens.labels(self.label).inc(done.prompt_tokens)
        self.request_prompt.labels(self.label).observe(done.prompt_tokens)
        if self.caching:
            self.queries.labels(self.label).inc(done.prompt_tokens)
            self.hits.labels(self.label).inc(done.cached_tokens)
        self.ttft.labels(self.label).observe(ttft_s)

    def finished(self, finished: Finished, ttft_s: float, e2e_s: float) -> None:
        """Count a finished request (``e2e_s``: seconds from its arrival to its last token)."""
        n = finished.completion_tokens
        self.generation_tokens.labels(self.label).inc(n)
        self.request_generation.labels(self.label).observe(n)
        self.success.labels(self.label, finished.finish_reason).inc()
        self.e2e.labels(self.label).observe(e2e_s)
        if n > 1:
            self.tpot.labels(self.label).observe((e2e_s - ttft_s) / (n - 1))


class _SchedulerCollector(Collector):
    """vLLM's scheduler gauges, read from the engine at scrape time."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauges = (
            ("vllm:num_requests_running", "Requests admitted to the engine", self.engine.running),
            ("vllm:num_requests_waiting", "Requests waiting for the engine", self.engine.queue_depth),
            ("vllm:kv_cache_usage_perc", "K/V room in use (1 = 100%)", self.engine.kv_cache_usage),
        )
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
