"""``GET /metrics`` (Prometheus), ``GET /stats`` (JSON) and ``GET /dashboard`` (HTML).

With API keys on, ``/stats`` answers a tenant with its own figures only (its namespace), and the
admin key with the whole deployment's; ``/metrics`` needs the admin key. The dashboard page holds
no data: its script reads ``/stats`` with the key given in the page's ``#key=`` fragment (which
browsers never send to the server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from engine.worker import Engine
from hashing import Namespace
from proxy.http.auth import (
    DEFAULT_TENANT,
    ApiKeys,
    ApiKeysDep,
    get_tenant,
    is_admin,
    reads_own_text,
    require_operator,
)
from proxy.observe import panels
from proxy.observe.deps import MetricsDep, UsageDep
from proxy.state import CacheDep, EngineDep, SettingsDep

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

router = APIRouter()


@router.get("/metrics", dependencies=[Depends(require_operator)])
async def metrics(m: MetricsDep) -> Response:
    body = await run_in_threadpool(generate_latest, m.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def stats_scope(request: Request, engine: EngineDep, api_keys: ApiKeysDep) -> Namespace | None:
    """None (everything) without API keys or for the admin key; else the caller's namespace."""
    if api_keys is None or is_admin(request):
        return None
    return engine.loaded.namespace(get_tenant(request))


def viewer(
    request: Request, scope: Namespace | None, engine: Engine, api_keys: ApiKeys | None
) -> Namespace | None:
    """The namespace whose prompts the caller may read: a tenant's own; without API keys, the one
    tenant's, for the admin key or, on a server with no key at all, for anyone; none for the admin
    key among API keys (it names an operator, not a tenant), and never for a client without a key
    on a server that has one."""
    if api_keys is not None:
        return scope
    return engine.loaded.namespace(DEFAULT_TENANT) if reads_own_text(request) else None


@router.get("/stats")
async def stats(
    request: Request,
    scope: Annotated[Namespace | None, Depends(stats_scope)],
    m: MetricsDep,
    cache: CacheDep,
    engine: EngineDep,
    settings: SettingsDep,
    usage: UsageDep,
    api_keys: ApiKeysDep,
) -> dict[str, Any]:
    """Totals for the deployment (from Redis: every replica adds up) and for this process, hit
    rates over the last minute and hour, TTFT by cache outcome, evictions, recent misses; and the
    dashboard's series and tables:

    - ``process.ttft_per_minute``: this process's median TTFT per minute of the last hour, by
      cache outcome; ``process.ttft_by_cached_tokens``: its median TTFT per bin of cached-prefix
      length over the last hour (``proxy.observe.series``).
    - ``deployment``: blocks and bytes stored, blocks per retention class, and the bytes named
      caches pin (``pinned_bytes``) within ``max_pinned_bytes`` (deployment scope).
    - ``timeline``: tokens queried and hit per minute of the last hour (from Redis).
    - ``usage``: ``[{"at", "blocks", "bytes"}]``, what the cache held, sampled by this process
      every 30 s over the last hour (``proxy.observe.usage``); deployment scope only.
    - ``hot_prefixes``: the 10 cached prefixes that saved the most tokens (``proxy.observe.panels``):
      ``tenant``, ``namespace``, ``hits``, ``tokens_saved``, ``blocks``, ``cached_tokens``,
      ``bytes``, ``ttl_seconds`` and ``text``, the prefix's first 60 characters after what the
      chat template writes before every chat (``panels.prefix_text``), for the caller's own
      tenant only (None for another tenant's, e.g. for the admin key).
    - ``tenants``: per tenant (namespace) with traffic, all-time ``prompt_tokens``,
      ``cached_tokens``, ``hit_rate`` and ``last_hour``; deployment scope only.

    Each is None when the cache is off, out of scope, or (read from Redis) Redis does not answer.
    """
    namespace_hex = scope.hex() if scope is not None else None
    out: dict[str, Any] = {
        "scope": "deployment" if scope is None else "tenant",
        "cache": "disabled" if cache is None else await run_in_threadpool(cache.health),
        "process": asdict(m.log.summary(namespace_hex)),
        "audit": asdict(m.audits.summary(namespace_hex)),
        "deployment": None,
        "timeline": None,
        "usage": None,
        "hot_prefixes": None,
        "tenants": None,
    }
    if cache is not None:
        deployment = await run_in_threadpool(cache.deployment_stats, scope)
        out["deployment"] = deployment.as_dict() if deployment is not None else None
        out["timeline"] = _rows(await run_in_threadpool(cache.timeline, scope))
        loaded, readable = engine.loaded, viewer(request, scope, engine, api_keys)
        hot = await run_in_threadpool(panels.hot_prefixes, cache, loaded, scope, readable, api_keys)
        out["hot_prefixes"] = _rows(hot)
        if scope is None:
            if out["deployment"] is not None:
                out["deployment"]["max_pinned_bytes"] = settings.max_pinned_bytes
            out["process"]["evictions"] = cache.stats().evictions
            out["usage"] = _rows(usage.points())
            out["tenants"] = _rows(await run_in_threadpool(panels.tenant_rates, cache, loaded, api_keys))
    return out


def _rows(rows: Sequence[DataclassInstance] | None) -> list[dict[str, Any]] | None:
    """Typed rows as JSON objects (their fields in order); None stays None."""
    return None if rows is None else [asdict(r) for r in rows]


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(resources.files("proxy").joinpath("static/dashboard.html").read_text())
