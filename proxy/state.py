"""Services live on ``app.state``; a route reaches each through one typed ``Annotated`` dependency,
defined once, beside the lowest layer that knows its type:

- ``engine``, ``settings``, ``cache``, ``started``: ``EngineDep``, ``SettingsDep``, ``CacheDep``,
  ``CacheOnDep`` (400 when caching is off), ``StartedDep``, here;
- ``api_keys`` and ``settings`` as both apps share them: ``ApiKeysDep``, ``ServerSettingsDep``
  (``proxy.http.auth``);
- ``metrics``, ``usage``: ``MetricsDep``, ``UsageDep`` (``proxy.observe.deps``);
- ``named``: ``NamedDep`` (``proxy.named.service``);
- ``responses``: ``ResponsesDep`` (``proxy.responses.state``);
- ``router`` (``kvproxy route``): ``RouterDep`` (``proxy.router.deps``).

Code that holds a ``Request`` rather than declaring a parameter calls the dependency's function
(``get_engine(request)``). The cache is seen through ``store.interface.CacheAdmin`` only: nothing
in proxy/ touches the store's parts.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.worker import Engine
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from store.admin_interface import CacheAdmin


def get_engine(request: Request) -> Engine:
    """The serving engine (made by the lifespan)."""
    engine: Engine = request.app.state.engine
    return engine


def get_settings(request: Request) -> Settings:
    """The server's settings."""
    settings: Settings = request.app.state.settings
    return settings


def get_cache(request: Request) -> CacheAdmin | None:
    """The cache; None when caching is off (``--no-cache``)."""
    cache: CacheAdmin | None = request.app.state.cache
    return cache


def require_cache(request: Request) -> CacheAdmin:
    """The cache, for routes that need one.

    Raises:
        OpenAIError: 400 when caching is off (``--no-cache``).
    """
    cache = get_cache(request)
    if cache is None:
        raise OpenAIError(400, "caching is off on this server (--no-cache)", code="cache_disabled")
    return cache


def get_started(request: Request) -> float:
    """When the server started (Unix seconds)."""
    started: float = request.app.state.started
    return started


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CacheDep = Annotated[CacheAdmin | None, Depends(get_cache)]
CacheOnDep = Annotated[CacheAdmin, Depends(require_cache)]
StartedDep = Annotated[float, Depends(get_started)]
