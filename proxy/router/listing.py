"""Listings the router answers itself: the union of what the replicas that are up list."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from proxy.router.replicas import Replica
from proxy.router.routing import Router

LIST_TIMEOUT_S = 5
"""How long a replica has to answer a listing."""


async def union(
    router: Router,
    url_of: Callable[[Replica], str],
    credentials: tuple[dict[str, str], dict[str, str] | None],
    field: str,
    key: str,
) -> list[dict[str, Any]]:
    """The entries (JSON objects holding ``key``, as the replicas wrote them) under ``field`` of
    the 200 answers of the replicas that are up to ``GET url_of(replica)`` with ``credentials``
    (headers, query parameters), each ``key`` once (the first listing wins); nothing from a
    replica that fails, answers otherwise or is slower than ``LIST_TIMEOUT_S``."""
    headers, params = credentials

    async def listed(url: str) -> list[dict[str, Any]]:
        replica = router.replicas.get(url)
        try:
            response = await replica.client.get(
                url_of(replica), headers=headers, params=params, timeout=LIST_TIMEOUT_S
            )
            found = response.json().get(field, []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
        return [m for m in found if isinstance(m, dict) and key in m]

    seen: dict[str, dict[str, Any]] = {}
    for entries in await asyncio.gather(*(listed(r.url) for r in router.replicas.candidates(None))):
        for entry in entries:
            seen.setdefault(entry[key], entry)
    return list(seen.values())
