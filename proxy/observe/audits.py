"""The fidelity audit as the server reports it: Prometheus metrics and the recent results behind
``/stats`` and the dashboard's audit panel (the audit itself is ``engine.audit``)."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.audit import AuditResult
from engine.worker import Engine

DIFFERENCE_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1, 2, 5, 10)
KEEP_RESULTS = 1000


@dataclass(frozen=True)
class AuditRow:
    """One audited hit (``engine.audit.AuditResult``) and when it was audited (Unix seconds)."""

    at: float
    prompt_tokens: int
    cached_tokens: int
    max_logit_difference: float
    tolerance: float
    tokens_compared: int
    mismatch: bool
    diverged: bool


@dataclass(frozen=True)
class AuditSummary:
    """``AuditReport.summary``: the audit's rate and the block format served, counts, the
    largest logit difference (None: no audit), and the last results, newest first."""

    rate: float
    block_format: str
    checks: int
    mismatches: int
    divergences: int
    pending: int
    dropped: int
    max_logit_difference: float | None
    recent: list[AuditRow]


class AuditReport:
    """Counts and keeps the results of ``engine``'s audit (``listen`` is called on its model
    thread; ``summary`` from the server's)."""

    def __init__(self, registry: CollectorRegistry, engine: Engine) -> None:
        self.engine = engine
        self.checks = Counter(
            "kvproxy_audit_checks", "Cache hits recomputed cold by the audit", registry=registry
        )
        self.mismatches = Counter(
            "kvproxy_audit_mismatches",
            "Audited hits whose cold recomputation differed beyond the format's tolerance (blocks removed)",
            registry=registry,
        )
        self.difference = Histogram(
            "kvproxy_audit_max_logit_difference",
            "Max absolute difference of the first token's logits, cached vs cold, per audited hit",
            buckets=DIFFERENCE_BUCKETS,
            registry=registry,
        )
        self._results: deque[tuple[float, AuditResult]] = deque(maxlen=KEEP_RESULTS)
        self._lock = threading.Lock()
        engine.on_audit(self.listen)

    def listen(self, result: AuditResult) -> None:
        self.checks.inc()
        self.mismatches.inc(result.mismatch)
        self.difference.observe(result.max_logit_difference)
        with self._lock:
            self._results.append((time.time(), result))

    def summary(self, namespace_hex: str | None) -> AuditSummary:
        """This process's audits of one namespace (a tenant) or all, of the block format served:
        counts (``divergences``: hits whose greedy answer parted from the cold one), the largest logit
        difference, and the last 20 results, newest first (``pending`` and ``dropped``: every
        namespace's sampled hits waiting, and never audited because too many were waiting)."""
        with self._lock:
            mine = [
                (at, r)
                for at, r in self._results
                if namespace_hex is None or r.namespace.hex() == namespace_hex
            ]
        return AuditSummary(
            rate=self.engine.audit_rate,
            block_format=self.engine.loaded.kv_spec.block_format,
            checks=len(mine),
            mismatches=sum(r.mismatch for _, r in mine),
            divergences=sum(r.diverged for _, r in mine),
            pending=self.engine.audits_pending,
            dropped=self.engine.audits_dropped,
            max_logit_difference=max((r.max_logit_difference for _, r in mine), default=None),
            recent=[
                AuditRow(
                    at,
                    r.prompt_tokens,
                    r.cached_tokens,
                    r.max_logit_difference,
                    r.tolerance,
                    r.tokens_compared,
                    r.mismatch,
                    r.diverged,
                )
                for at, r in reversed(mine[-20:])
            ],
        )
