"""Named caches (Gemini's ``cachedContents``) behind the router.

A named cache's blocks are on the replica that computed them, and its record in that replica's
Redis (shared by every replica on the same Redis and key prefix, else that replica's alone). So
the router sends everything that names a cache (its get, patch and delete, and every request
whose ``cachedContent``, or ``cached_content`` on the OpenAI and Anthropic routes, names it) to
the replica holding it: remembered per tenant when it was created (in the route index, until the
cache's expiry, so every router on that Redis knows; in this process while Redis is off), else
found by asking the replicas with the client's own credentials (a replica answers only its
tenant's caches: another tenant's name is found nowhere). A listing is the union of every
replica's, paged by the router.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from datetime import datetime
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response

from proxy.http.errors import OpenAIError
from proxy.http.numbers import page_bounds
from proxy.router.deps import credentials
from proxy.router.policy import Endpoint
from proxy.router.replicas import Replica
from proxy.router.routing import Router

PREFIX = "cachedContents/"
NAME = re.compile(r"cachedContents/[A-Za-z0-9_-]{1,128}")
"""A named cache's name as the router looks it up (``kvproxy serve``'s ids are hex): nothing
else is ever put in a URL the router asks a replica."""
LOOKUP_TIMEOUT_S = 5.0
PAGE_MOST = 1000
"""The largest ``pageSize`` a replica's listing takes (the router reads every page)."""


def named_in(kind: Endpoint, body: dict[str, Any]) -> str | None:
    """The named cache a request body starts from, as ``cachedContents/{id}`` (a bare id is
    taken, as the replicas take it): Gemini's ``cachedContent`` (or ``cached_content``), the
    extension field ``cached_content`` on the chat and Messages routes; else None."""
    if kind not in ("gemini", "chat", "messages"):
        return None
    name = body.get("cachedContent") if kind == "gemini" else None
    name = body.get("cached_content") if name is None else name
    if not isinstance(name, str):
        return None  # NOTE: a name that is not a string: the replica refuses the body in its own words
    return name if name.startswith(PREFIX) else PREFIX + name


async def holder(router: Router, request: Request, tenant: str, name: str) -> str | None:
    """The replica holding ``tenant``'s named cache ``name``: the one remembered while it is up,
    else the first up replica that finds it (then remembered); None when no replica that is up
    has it (the request goes where its prompt leads, and that replica answers the 404).

    Raises:
        OpenAIError: 503 when the replica remembered is down and no other has the cache.
    """
    if not NAME.fullmatch(name):
        return None  # NOTE: no replica holds it; the one the request goes to answers in its words
    known = await router.response_replica(tenant, name)
    if known is not None and known not in {r.url for r in router.replicas.all}:
        known = None  # NOTE: remembered by a router in front of other replicas
    if known is not None and router.replicas.get(known).available:
        return known
    for replica in router.replicas.candidates(None, {known} if known else set()):
        found = await _ask(replica, request, name)
        if found is not None:
            await remember(router, tenant, replica, found)
            return replica.url
    if known is not None:
        raise OpenAIError(
            503,
            f"the replica holding {name} ({known}) is not available; try again",
            type="server_error",
            code="no_replica",
            headers={"Retry-After": "1"},
        )
    return None


async def _ask(replica: Replica, request: Request, name: str) -> dict[str, Any] | None:
    """``name`` as ``replica`` describes it to the client's credentials (None: not found there)."""
    headers, params = credentials(request)
    try:
        response = await replica.client.get(
            f"{replica.root}/v1beta/{name}", headers=headers, params=params, timeout=LOOKUP_TIMEOUT_S
        )
        doc = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


async def remember(router: Router, tenant: str, replica: Replica, described: dict[str, Any]) -> None:
    """``replica`` holds the cache ``described`` (a ``CachedContent``): until its ``expireTime``,
    requests naming it go there."""
    name, expires = described.get("name"), _unix(described.get("expireTime"))
    if isinstance(name, str) and name.startswith(PREFIX) and expires is not None:
        ttl = math.ceil(expires - time.time())
        if ttl > 0:
            await router.remember_response(tenant, name, replica, ttl)


async def learn(router: Router, tenant: str, response: Response) -> None:
    """After a create or a patch the router forwarded: remember where the cache is, until its
    (new) expiry (``remember``); nothing for an answer other than 200."""
    body = getattr(response, "body", None)  # NOTE: a whole answer's (``forward.whole``, ``pass_through``)
    if response.status_code != 200 or "x-kvproxy-replica" not in response.headers or body is None:
        return
    try:
        described = json.loads(bytes(body))
    except ValueError:
        return
    if isinstance(described, dict):
        await remember(router, tenant, router.replicas.get(response.headers["x-kvproxy-replica"]), described)


async def listing(router: Router, request: Request) -> Response:
    """The tenant's caches on every replica that is up (each once, oldest first), ``pageSize`` a
    page (``nextPageToken`` the next); a replica's error answer (a wrong key) is passed on.

    Raises:
        OpenAIError: 400 for a ``pageSize`` or ``pageToken`` this router did not give; 503
            when no replica is up.
    """
    query = request.query_params
    start, size_n = page_bounds(query.get("pageToken", ""), query.get("pageSize", "100"), PAGE_MOST)
    replicas = router.replicas.candidates(None)
    if not replicas:
        raise OpenAIError(503, "no replica is available", type="server_error", code="no_replica")
    found: dict[str, dict[str, Any]] = {}
    for listed in await asyncio.gather(*(_all_of(r, request) for r in replicas)):
        if isinstance(listed, httpx.Response):
            return Response(listed.content, listed.status_code, media_type="application/json")
        for cache in listed:
            found.setdefault(str(cache.get("name")), cache)
    caches = sorted(found.values(), key=lambda c: _unix(c.get("createTime")) or 0.0)
    out: dict[str, Any] = {"cachedContents": caches[start : start + size_n]}
    if start + size_n < len(caches):
        out["nextPageToken"] = str(start + size_n)
    return Response(json.dumps(out), media_type="application/json")


async def _all_of(replica: Replica, request: Request) -> list[dict[str, Any]] | httpx.Response:
    """Every cache ``replica`` lists to the client's credentials (every page), or its error
    answer; nothing from a replica that cannot be reached."""
    headers, params = credentials(request)
    caches: list[dict[str, Any]] = []
    token = ""
    while True:
        page = params | {"pageSize": str(PAGE_MOST)} | ({"pageToken": token} if token else {})
        try:
            response = await replica.client.get(
                f"{replica.root}/v1beta/cachedContents",
                headers=headers,
                params=page,
                timeout=LOOKUP_TIMEOUT_S,
            )
            if response.status_code != 200:
                return response
            doc = response.json()
        except (httpx.HTTPError, ValueError):
            return caches
        caches += [c for c in doc.get("cachedContents") or [] if isinstance(c, dict)]
        token = doc.get("nextPageToken") or ""
        if not token:
            return caches


def _unix(stamp: object) -> float | None:
    """An RFC 3339 timestamp (Google's ``2026-12-03T14:00:00.000000Z``) as Unix seconds."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None
