"""The observers on ``app.state`` as typed dependencies (``proxy.state`` lists every service)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from proxy.observe.metrics import Metrics
from proxy.observe.usage import UsageHistory


def get_metrics(request: Request) -> Metrics:
    """The app's metrics (``proxy.observe.metrics``)."""
    metrics: Metrics = request.app.state.metrics
    return metrics


def get_usage(request: Request) -> UsageHistory:
    """The cache's usage over the last hour (``proxy.observe.usage``)."""
    usage: UsageHistory = request.app.state.usage
    return usage


MetricsDep = Annotated[Metrics, Depends(get_metrics)]
UsageDep = Annotated[UsageHistory, Depends(get_usage)]
