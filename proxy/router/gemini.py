"""Gemini's API (``/v1beta``, the ``google-genai`` client) through the router.

``generateContent`` and ``streamGenerateContent`` are routed by their prompt as the other
dialects are (``Identity`` renders Gemini's contents as the replica does; a stream passes through
as it arrives); ``countTokens`` and the models are passed on; a named cache
(``cachedContents``) is created on the replica its content's prompt would go to, and every later
use of it (get, patch, delete, a request whose ``cachedContent`` names it) goes to the replica
holding it (``proxy.router.named``); its listing is every replica's. The key comes as
``x-goog-api-key`` or ``?key=`` (or a Bearer header) and scopes what the router remembers, as on
the other routes; the router's own errors here are in Google's shape
(``proxy.http.errors.dialect``).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.gemini.protocol import model_name
from proxy.http.numbers import page_bounds
from proxy.router.deps import RouterDep, RouteTenant, credentials
from proxy.router.forward import forward, pass_through, while_connected
from proxy.router.listing import union
from proxy.router.named import PAGE_MOST, PREFIX, holder, learn, listing, named_in
from proxy.router.policy import Endpoint
from proxy.router.replicas import Replica
from proxy.router.routing import Router

api = APIRouter()


async def _forward(request: Request, router: Router, tenant: str, kind: Endpoint) -> Response:
    raw = await request.body()
    return await while_connected(request, forward(router, request, kind, raw, tenant))


@api.post("/v1beta/models/{model}:generateContent")
@api.post("/v1beta/models/{model}:streamGenerateContent")
async def generate(request: Request, tenant: RouteTenant, router: RouterDep) -> Response:
    """Routed by the prompt (to the replica holding the named cache it names, if any)."""
    return await _forward(request, router, tenant, "gemini")


@api.post("/v1beta/models/{model}:countTokens")
async def count_tokens(request: Request, model: str, tenant: RouteTenant, router: RouterDep) -> Response:
    """To the replica holding the named cache the body names, else the least loaded one."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None  # NOTE: the replica answers a bad body in its own words
    named = named_in("gemini", body) if isinstance(body, dict) else None
    prefer = await holder(router, request, tenant, named) if named is not None else None
    return await pass_through(router, request, prefer, model_name(model))


@api.get("/v1beta/models")
async def models(request: Request, _: RouteTenant, router: RouterDep) -> dict[str, Any]:
    """The union of the ``Model`` resources the replicas that are up list (the first wins),
    paged by the router as a replica pages its own (``pageSize``, ``pageToken``).

    Raises:
        OpenAIError: 400 for a ``pageSize`` or ``pageToken`` this router did not give.
    """
    query = request.query_params
    start, size = page_bounds(query.get("pageToken", ""), query.get("pageSize", "50"), PAGE_MOST)
    headers, params = credentials(request)
    params = params | {"pageSize": str(PAGE_MOST)}

    def url_of(replica: Replica) -> str:
        return f"{replica.root}/v1beta/models"

    models = await union(router, url_of, (headers, params), "models", "name")
    out: dict[str, Any] = {"models": models[start : start + size]}
    if start + size < len(models):
        out["nextPageToken"] = str(start + size)
    return out


@api.get("/v1beta/models/{model}")
async def model(request: Request, model: str, _: RouteTenant, router: RouterDep) -> Response:
    """From the least loaded replica serving ``model``."""
    return await pass_through(router, request, model=model_name(model))


@api.post("/v1beta/cachedContents")
async def create_cache(request: Request, tenant: RouteTenant, router: RouterDep) -> Response:
    """Routed as a prompt starting with the content would be; the router then remembers which
    replica holds the cache, until its expiry."""
    response = await _forward(request, router, tenant, "cached_contents")
    await learn(router, tenant, response)
    return response


@api.get("/v1beta/cachedContents")
async def list_caches(request: Request, _: RouteTenant, router: RouterDep) -> Response:
    """The tenant's caches on every replica, paged by the router (``proxy.router.named``)."""
    return await listing(router, request)


@api.get("/v1beta/cachedContents/{cache_id}")
@api.patch("/v1beta/cachedContents/{cache_id}")
@api.delete("/v1beta/cachedContents/{cache_id}")
async def named_cache(request: Request, cache_id: str, tenant: RouteTenant, router: RouterDep) -> Response:
    """To the replica holding the cache (a new expiry is remembered; a deleted cache forgotten)."""
    name = PREFIX + cache_id
    response = await pass_through(router, request, await holder(router, request, tenant, name))
    if request.method == "PATCH":
        await learn(router, tenant, response)
    elif request.method == "DELETE" and response.status_code == 200:
        await router.forget_response(tenant, name)
    return response
