"""What the router's routes ask of a request: whose traffic it is (the route tenant), the
``Router`` on ``app.state`` (``RouterDep``; the API keys are ``proxy.http.auth.ApiKeysDep``),
and the client's credentials as they are passed on to replicas."""

from __future__ import annotations

from typing import Annotated

import xxhash
from fastapi import Depends, Request

from proxy.http.auth import CREDENTIAL_HEADERS, DEFAULT_TENANT, ApiKeysDep, credential, get_tenant
from proxy.router.routing import Router


def route_tenant(request: Request, api_keys: ApiKeysDep) -> str:
    """Whose traffic a request counts as in the route index: the tenant of the router's own API key
    (``--api-keys``), or without them a digest of the key the client sends on to the replicas
    (``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key`` or Gemini's ``?key=``; an
    ``Authorization`` of another scheme whole), so one replica tenant's prompts and named caches
    never steer, or reveal themselves to, another's. Two different credentials are refused
    (``proxy.http.auth.credential``): the one the tenant comes from is the one the replica gets.

    Raises:
        OpenAIError: 401 when the router has keys and the request's is missing or wrong; 400 when
            the request carries two different credentials.
    """
    if api_keys is not None:
        return get_tenant(request)
    found = credential(request)
    return DEFAULT_TENANT if found is None else f"key-{xxhash.xxh3_64_hexdigest(found.value.encode())}"


RouteTenant = Annotated[str, Depends(route_tenant)]


def get_router(request: Request) -> Router:
    """The app's ``Router`` (made by its lifespan)."""
    router: Router = request.app.state.router
    return router


RouterDep = Annotated[Router, Depends(get_router)]


def credentials(request: Request) -> tuple[dict[str, str], dict[str, str]]:
    """The client's credentials as a request of the router's own to a replica carries them:
    (headers, query parameters: Gemini's ``key`` on ``/v1beta/`` routes)."""
    headers = {k: v for k, v in request.headers.items() if k.lower() in CREDENTIAL_HEADERS}
    key = request.query_params.get("key") if request.url.path.startswith("/v1beta/") else None
    return headers, ({"key": key} if key else {})
