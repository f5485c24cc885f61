"""``GET /metrics`` (Prometheus), ``GET /stats`` (JSON) and ``GET /dashboard`` (HTML).

With API keys on, ``/stats`` answers a tenant with its own figures only (its namespace), and the
admin key with the whole deployment's; ``/metrics`` needs the admin key. The dashboard page holds
no data: its script reads ``/stats`` with the key given in the page's ``#key=`` fragment (which
browsers never send to the server).
"""

from __future__ import annotations

import secrets
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from hashing import Namespace
from proxy.auth import bearer, get_tenant, require_admin
from proxy.state import CacheDep, EngineDep, MetricsDep, get_settings

router = APIRouter()


@router.get("/metrics", dependencies=[Depends(require_admin)])
async def metrics(m: MetricsDep) -> Response:
    body = await run_in_threadpool(generate_latest, m.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def stats_scope(request: Request, engine: EngineDep) -> Namespace | None:
    """None (everything) without API keys or for the admin key; else the caller's namespace."""
    if request.app.state.api_keys is None:
        return None
    admin_key = get_settings(request).admin_key
    token = bearer(request)
    if (
        admin_key is not None
        and token is not None
        and secrets.compare_digest(token.encode(), admin_key.encode())
    ):
        return None
    return engine.loaded.namespace(get_tenant(request))


@router.get("/stats")
async def stats(
    scope: Annotated[Namespace | None, Depends(stats_scope)], m: MetricsDep, cache: CacheDep
) -> dict[str, Any]:
    """Totals for the deployment (from Redis: every replica adds up) and for this process, hit
    rates over the last minute and hour, TTFT by cache outcome, evictions, recent misses."""
    out: dict[str, Any] = {
        "scope": "deployment" if scope is None else "tenant",
        "cache": "disabled" if cache is None else await run_in_threadpool(cache.health),
        "process": m.log.summary(scope.hex() if scope is not None else None),
        "deployment": None,
        "timeline": None,
    }
    if cache is not None:
        out["deployment"] = await run_in_threadpool(cache.deployment_stats, scope)
        out["timeline"] = await run_in_threadpool(cache.timeline, scope)
        if scope is None:
            out["process"]["evictions"] = cache.stats().evictions
    return out


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(resources.files("proxy").joinpath("static/dashboard.html").read_text())
