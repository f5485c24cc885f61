"""Per-request records of this process, behind ``/stats`` and the dashboard: totals, hit rates over
the last minute and hour, TTFT percentiles by cache outcome and its series (``proxy.observe.series``), the
recent misses."""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass

from proxy.observe.series import (
    CachedTokensTtft,
    MinuteTtft,
    PromptTokensTtft,
    ttft_by_cached_tokens,
    ttft_by_prompt_tokens,
    ttft_per_minute,
)
from store.admin_interface import TokenWindow
from store.outcomes import CacheKind, MissReason

KEEP_RECORDS = 20_000


@dataclass(frozen=True)
class RequestRecord:
    """One answered request, as the stats see it."""

    at: float  # Unix time of the first token
    namespace: str  # hex: the tenant's cache namespace
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    kind: CacheKind
    reason: MissReason | None
    prefill_s: float
    saved_s: float


@dataclass(frozen=True)
class TtftStats:
    """TTFT of one cache outcome over the last hour (seconds; None without a request): median,
    95th percentile, the median prompt length, and the median TTFT per token computed."""

    count: int
    p50: float | None
    p95: float | None
    prompt_tokens_p50: float | None
    per_uncached_token_p50: float | None


@dataclass(frozen=True)
class RecentMiss:
    """A request that missed the cache, in part or whole: when, its tokens, outcome and why."""

    at: float
    prompt_tokens: int
    cached_tokens: int
    cache: CacheKind
    reason: MissReason | None


@dataclass(frozen=True)
class ProcessSummary:
    """This process's figures (``RequestLog.summary``): totals, token hit rates over the last
    minute and hour, TTFT by outcome and its series over the last hour (``proxy.observe.series``),
    and the last 20 misses, newest first; the tokens speculation drafted for the answers since start
    and how many of them were accepted (``engine.drafting``)."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    prefill_seconds: float
    prefill_seconds_saved: float
    last_minute: TokenWindow
    last_hour: TokenWindow
    ttft_seconds: dict[CacheKind, TtftStats]
    ttft_per_minute: list[MinuteTtft]
    ttft_by_cached_tokens: list[CachedTokensTtft]
    ttft_by_prompt_tokens: list[PromptTokensTtft]
    recent_misses: list[RecentMiss]
    draft_tokens: int
    accepted_tokens: int


class RequestLog:
    """The last ``KEEP_RECORDS`` requests (thread-safe), and drafts per namespace."""

    def __init__(self) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=KEEP_RECORDS)
        self._drafts: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def drafted(self, namespace_hex: str, drafted: int, accepted: int) -> None:
        """A finished answer of ``namespace_hex`` drafted ``drafted`` tokens, ``accepted`` kept."""
        with self._lock:
            total = self._drafts.get(namespace_hex, (0, 0))
            self._drafts[namespace_hex] = (total[0] + drafted, total[1] + accepted)

    def summary(self, namespace_hex: str | None) -> ProcessSummary:
        """This process's figures for one namespace (a tenant) or all."""
        now = time.time()
        with self._lock:
            mine = [r for r in self._records if namespace_hex is None or r.namespace == namespace_hex]
            drafts = [d for n, d in self._drafts.items() if namespace_hex is None or n == namespace_hex]

        def window(seconds: float) -> TokenWindow:
            rs = [r for r in mine if r.at >= now - seconds]
            queried, hit = sum(r.prompt_tokens for r in rs), sum(r.cached_tokens for r in rs)
            return TokenWindow(queried, hit, hit / queried if queried else None)

        def ttft(kind: CacheKind) -> TtftStats:
            rs = [r for r in mine if r.kind == kind and r.at >= now - 3600]
            if not rs:
                return TtftStats(0, None, None, None, None)
            values = sorted(r.ttft_s for r in rs)
            p95 = statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]
            return TtftStats(
                count=len(values),
                p50=statistics.median(values),
                p95=p95,
                prompt_tokens_p50=statistics.median(r.prompt_tokens for r in rs),
                # NOTE: seconds per token computed: what a hit and a miss of other lengths share
                per_uncached_token_p50=statistics.median(
                    r.ttft_s / max(1, r.prompt_tokens - r.cached_tokens) for r in rs
                ),
            )

        misses = [r for r in mine if r.kind != "hit"][-20:]
        hour = [r for r in mine if r.at >= now - 3600]
        kinds: tuple[CacheKind, ...] = ("hit", "partial", "miss")
        return ProcessSummary(
            requests=len(mine),
            prompt_tokens=sum(r.prompt_tokens for r in mine),
            cached_tokens=sum(r.cached_tokens for r in mine),
            prefill_seconds=sum(r.prefill_s for r in mine),
            prefill_seconds_saved=sum(r.saved_s for r in mine),
            last_minute=window(60),
            last_hour=window(3600),
            ttft_seconds={kind: ttft(kind) for kind in kinds},
            ttft_per_minute=ttft_per_minute((r.at, r.kind, r.ttft_s) for r in hour),
            ttft_by_cached_tokens=ttft_by_cached_tokens((r.cached_tokens, r.ttft_s) for r in hour),
            ttft_by_prompt_tokens=ttft_by_prompt_tokens((r.prompt_tokens, r.kind, r.ttft_s) for r in hour),
            recent_misses=[
                RecentMiss(r.at, r.prompt_tokens, r.cached_tokens, r.kind, r.reason) for r in reversed(misses)
            ],
            draft_tokens=sum(d[0] for d in drafts),
            accepted_tokens=sum(d[1] for d in drafts),
        )
