"""What the router's routes ask of a request: whose traffic it is (the route tenant), the
``Router`` on ``app.state``, and the client's credentials as they are passed on to replicas."""

from __future__ import annotations

from typing import Annotated

import xxhash
from fastapi import Depends, Request

from proxy.http.auth import DEFAULT_TENANT, bearer, get_tenant
from proxy.router.routing import Router

CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key")
"""The headers a client's API key comes in (OpenAI's, Anthropic's, Google's clients)."""


def route_tenant(request: Request) -> str:
    """Whose traffic a request counts as in the route index: the tenant of the router's own API key
    (``--api-keys``), or without them a digest of the key the client sends on to the replicas
    (``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key`` or Gemini's ``?key=``), so one
    replica tenant's prompts and named caches never steer, or reveal themselves to, another's.

    Raises:
        OpenAIError: 401 when the router has keys and the request's is missing or wrong.
    """
    if request.app.state.api_keys is not None:
        return get_tenant(request)
    token = bearer(request)
    return DEFAULT_TENANT if token is None else f"key-{xxhash.xxh3_64_hexdigest(token.encode())}"


RouteTenant = Annotated[str, Depends(route_tenant)]


def router_of(request: Request) -> Router:
    """The app's ``Router`` (made by its lifespan)."""
    router: Router = request.app.state.router
    return router


def credentials(request: Request) -> tuple[dict[str, str], dict[str, str]]:
    """The client's credentials as a request of the router's own to a replica carries them:
    (headers, query parameters: Gemini's ``key`` on ``/v1beta/`` routes)."""
    headers = {k: v for k, v in request.headers.items() if k.lower() in CREDENTIAL_HEADERS}
    key = request.query_params.get("key") if request.url.path.startswith("/v1beta/") else None
    return headers, ({"key": key} if key else {})
