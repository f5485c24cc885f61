"""API keys and tenants: who is asking, and whose cache namespace they use.

The tenant comes only from the authenticated key, never from the request body, so body fields
(``user``, ``prompt_cache_key``, ``cache_salt``, ...) can never widen cache sharing.
"""

from __future__ import annotations

import secrets
from typing import Annotated, NamedTuple

import xxhash
from fastapi import Depends, Request

from proxy.config import ServerSettings, Settings
from proxy.http.errors import OpenAIError
from proxy.setting_values import key_file

DEFAULT_TENANT = "default"

ApiKeys = dict[str, str]
"""``--api-keys`` parsed: tenant by key (``parse_api_keys``)."""


def get_api_keys(request: Request) -> ApiKeys | None:
    """The app's API keys (``app.state.api_keys``, set by both apps' factories); None when
    authentication is off."""
    keys: ApiKeys | None = request.app.state.api_keys
    return keys


def get_server_settings(request: Request) -> ServerSettings:
    """The app's settings as both apps share them (``app.state.settings``: a ``Settings`` for
    ``kvproxy serve``, a ``RouteSettings`` for ``kvproxy route``)."""
    settings: ServerSettings = request.app.state.settings
    return settings


ApiKeysDep = Annotated[ApiKeys | None, Depends(get_api_keys)]
ServerSettingsDep = Annotated[ServerSettings, Depends(get_server_settings)]


def parse_api_keys(value: str | None) -> ApiKeys | None:
    """``--api-keys`` as ``{key: tenant}``, or None when authentication is off.

    Accepts a comma-separated list whose items are entries or files of one entry per line (``#``
    starts a comment; ``proxy.config.key_file`` says which). An entry is ``key`` (a tenant of its
    own, named by a digest of the key) or ``key=tenant`` (keys naming one tenant share its cache).

    Raises:
        ValueError: the value names no key at all, or a file that does not exist.
    """
    if value is None or not value.strip():
        return None
    raw: list[str] = []
    for item in value.split(","):
        path = key_file(item.strip(), "--api-keys") if item.strip() else None
        raw += path.read_text().splitlines() if path is not None else [item]
    entries = [line.split("#", 1)[0].strip() for line in raw]
    table: ApiKeys = {}
    for entry in filter(None, entries):
        key, _, tenant = (part.strip() for part in entry.partition("="))
        table[key] = tenant or f"key-{xxhash.xxh3_64_hexdigest(key.encode())}"
    if not table:
        raise ValueError("--api-keys names no key")
    return table


CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key")
"""The headers a client's key comes in: OpenAI's clients (``Authorization: Bearer``),
Anthropic's (``x-api-key``), Google's (``x-goog-api-key``, or ``?key=`` on ``/v1beta/``)."""


class Credential(NamedTuple):
    """The one credential a request presents: ``value`` (a Bearer token, a header's key, Gemini's
    ``?key=``, or a whole ``Authorization`` header of another scheme), and whether it is an API key
    (anything but that other scheme)."""

    value: str
    api_key: bool


def credential(request: Request) -> Credential | None:
    """The request's credential, from every place one can come (``CREDENTIAL_HEADERS``, each as
    often as it is repeated, and ``?key=`` on the Gemini routes); None when it carries none.

    NOTE: a server or router keys the tenant on one of them and a replica may read another (or
    the last of a repeated header, as a proxy passes it on), so two that differ are refused:
    whatever the tenant is derived from is exactly what every replica gets.

    Raises:
        OpenAIError: 400 (``conflicting_api_keys``, ``param`` naming where the second came from)
            when two credentials differ.
    """
    found: list[tuple[str, Credential]] = []
    for name in CREDENTIAL_HEADERS:
        for raw in request.headers.getlist(name):
            scheme, _, token = raw.strip().partition(" ")
            if name == "authorization" and scheme.lower() != "bearer":
                found.append((name, Credential(raw.strip(), False)))
            else:
                found.append(
                    (name, Credential(token.strip() if name == "authorization" else raw.strip(), True))
                )
    if request.url.path.startswith("/v1beta/"):
        found += [("key", Credential(v.strip(), True)) for v in request.query_params.getlist("key")]
    found = [(where, c) for where, c in found if c.value]
    for where, other in found[1:]:
        if other.value != found[0][1].value:
            first = found[0][0]
            raise OpenAIError(
                400,
                f"the request carries two different credentials ({first} and {where}): send one key, once",
                param=where,
                code="conflicting_api_keys",
            )
    return found[0][1] if found else None


def bearer(request: Request) -> str | None:
    """The API key: ``Authorization: Bearer <key>`` (OpenAI's clients), ``x-api-key: <key>``
    (Anthropic's), or ``x-goog-api-key: <key>`` or ``?key=<key>`` on the Gemini routes (Google's);
    None without one (an ``Authorization`` of another scheme is not a key).

    Raises:
        OpenAIError: 400 when the request carries two different credentials (``credential``).
    """
    found = credential(request)
    return found.value if found is not None and found.api_key else None


def get_tenant(request: Request) -> str:
    """The tenant of the request's API key.

    Raises:
        OpenAIError: 401 when keys are required and this one is missing or wrong; 400 when the
            request carries two different keys (``credential``).
    """
    table = get_api_keys(request)
    token = bearer(request)  # NOTE: first: two different keys are refused even on an open server
    if table is None:
        return DEFAULT_TENANT
    # NOTE: compare against every key in constant time, so timing reveals nothing about keys.
    tenant = None
    for key, name in table.items():
        if token is not None and secrets.compare_digest(token.encode(), key.encode()):
            tenant = name
    if tenant is None:
        message = "Missing API key" if token is None else "Incorrect API key provided"
        raise OpenAIError(401, message, code="invalid_api_key")
    return tenant


def is_admin(request: Request) -> bool:
    """Whether the request carries the admin key (compared in constant time)."""
    settings = get_server_settings(request)
    token = bearer(request)
    return (
        settings.admin_key is not None
        and token is not None
        and secrets.compare_digest(token.encode(), settings.admin_key.encode())
    )


def keys_configured(request: Request) -> bool:
    """Whether the server has any key at all (``--admin-key`` or ``--api-keys``)."""
    return get_server_settings(request).admin_key is not None or get_api_keys(request) is not None


def reads_own_text(request: Request) -> bool:
    """Whether the caller may read prompt text cached in its own namespace: a tenant's key
    always (its namespace is its own); without API keys, the admin key, or anyone on a server
    with no key at all (the one tenant is everyone's), never a client without a key on a server
    that has one."""
    return get_api_keys(request) is not None or is_admin(request) or not keys_configured(request)


def require_admin(request: Request) -> None:
    """The cache routes that read or write cache contents (``/v1/cache/*``): only the admin key
    passes, 403 for a valid API key (it names a tenant, not an operator), 401 otherwise. Closed by
    default: without ``--admin-key``, anonymous clients pass only when the operator opted in
    (``--allow-anonymous-admin``) and no API keys are set. A server without an admin key says so,
    since no client key can pass it."""
    settings = get_server_settings(request)
    anonymous = isinstance(settings, Settings) and settings.allow_anonymous_admin  # NOTE: serve only
    if is_admin(request) or (anonymous and not keys_configured(request)):
        return
    if settings.admin_key is None:
        # NOTE: no key would pass: the operator must start the server differently, not the client
        how = "" if keys_configured(request) else " (or --allow-anonymous-admin, on a server without keys)"
        none = "this route needs the admin key and this server has none"
        _refuse(request, f"{none}: start it with --admin-key{how}")
    _refuse(request, "this route needs the admin key (--admin-key)")


def require_operator(request: Request) -> None:
    """Counters and metrics (``/metrics``, the router's ``/stats``): open while the server has no
    key at all (a single-user server, Prometheus scraping), else the admin key only."""
    if is_admin(request) or not keys_configured(request):
        return
    _refuse(request, "this route needs the admin key")


def _refuse(request: Request, message: str) -> None:
    if get_api_keys(request) is not None:
        try:
            get_tenant(request)
        except OpenAIError:
            pass
        else:
            raise OpenAIError(403, f"{message}; an API key is not enough", code="permission_denied")
    raise OpenAIError(401, message, code="invalid_api_key")


Tenant = Annotated[str, Depends(get_tenant)]
