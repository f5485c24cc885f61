"""What the router measures, to prove the routing works: per replica, the requests by decision,
the cached tokens the router predicted against those the replica reported in its usage
(``prompt_tokens_details.cached_tokens``), its health and the requests in flight.

Labels are bounded: ``replica`` is one of the configured upstream URLs, ``decision`` one of
``affinity``, ``balance``, ``fallback``, ``least_loaded``, ``round_robin``, ``retry``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.router.policy import Decision
from proxy.router.replies import ChatUsage


class RouterStats(TypedDict):
    """``/stats``' figures per replica URL: ``up``, ``inflight``, the counts (``requests``,
    ``decision_<decision>``, ``error_<kind>``, tokens) and the hit rates (None before any usage)."""

    replicas: dict[str, dict[str, int | float | bool | None]]


class RouterMetrics:
    """Prometheus series (own registry) and the same figures as JSON for ``/stats``."""

    def __init__(self, replicas: list[str]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvproxy_route_requests",
            "Requests sent, by replica and decision",
            ["replica", "decision"],
            registry=self.registry,
        )
        self.predicted = Counter(
            "kvproxy_route_predicted_tokens",
            "Prompt tokens the router expected the replica to hold",
            ["replica"],
            registry=self.registry,
        )
        self.reported = Counter(
            "kvproxy_route_reported_cached_tokens",
            "cached_tokens the replica reported in usage",
            ["replica"],
            registry=self.registry,
        )
        self.prompt = Counter(
            "kvproxy_route_prompt_tokens",
            "prompt_tokens the replica reported in usage",
            ["replica"],
            registry=self.registry,
        )
        self.errors = Counter(
            "kvproxy_route_upstream_errors",
            "Failed upstream requests by replica and kind",
            ["replica", "kind"],
            registry=self.registry,
        )
        self.up = Gauge(
            "kvproxy_upstream_up", "1 while the replica is routed to", ["replica"], registry=self.registry
        )
        self.inflight = Gauge(
            "kvproxy_route_inflight",
            "Requests this router has in flight per replica",
            ["replica"],
            registry=self.registry,
        )
        self._totals: dict[str, dict[str, int]] = {r: defaultdict(int) for r in replicas}
        for replica in replicas:
            self.up.labels(replica).set(1)
            self.inflight.labels(replica).set(0)

    def sent(self, replica: str, decision: Decision, predicted_tokens: int) -> None:
        self.requests.labels(replica, decision).inc()
        self.predicted.labels(replica).inc(predicted_tokens)
        totals = self._totals[replica]
        totals["requests"] += 1
        totals[f"decision_{decision}"] += 1
        totals["predicted_tokens"] += predicted_tokens

    def usage(self, replica: str, usage: ChatUsage) -> None:
        """Count a response's ``usage`` (missing figures count as 0)."""
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        self.prompt.labels(replica).inc(prompt)
        self.reported.labels(replica).inc(cached)
        self._totals[replica]["prompt_tokens"] += prompt
        self._totals[replica]["reported_cached_tokens"] += cached

    def failed(self, replica: str, kind: str) -> None:
        self.errors.labels(replica, kind).inc()
        self._totals[replica][f"error_{kind}"] += 1

    def stats(self, up: dict[str, bool], inflight: dict[str, int]) -> RouterStats:
        """Per replica: health, in flight, requests, decisions, errors, tokens and hit rates."""
        out: dict[str, dict[str, int | float | bool | None]] = {}
        for replica, totals in self._totals.items():
            base = dict.fromkeys(
                ("requests", "predicted_tokens", "prompt_tokens", "reported_cached_tokens"), 0
            )
            prompt = totals["prompt_tokens"]
            out[replica] = (
                base
                | dict(totals)
                | {
                    "up": up.get(replica, False),
                    "inflight": inflight.get(replica, 0),
                    "predicted_hit_rate": totals["predicted_tokens"] / prompt if prompt else None,
                    "reported_hit_rate": totals["reported_cached_tokens"] / prompt if prompt else None,
                }
            )
        return {"replicas": out}
