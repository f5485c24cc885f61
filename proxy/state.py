"""Services live on ``app.state``; routes reach them through these accessors, as ``Annotated``
dependency aliases (``EngineDep``, ``CacheDep``, ``CacheOnDep`` (400 when caching is off),
``SettingsDep``, ``MetricsDep``).

The cache is seen through ``store.interface.CacheAdmin`` only: nothing in proxy/ touches the
store's parts.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.worker import Engine
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.observe.metrics import Metrics
from store.admin_interface import CacheAdmin


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_cache(request: Request) -> CacheAdmin | None:
    return request.app.state.cache


def require_cache(request: Request) -> CacheAdmin:
    """The cache, for routes that need one.

    Raises:
        OpenAIError: 400 when caching is off (``--no-cache``).
    """
    cache = get_cache(request)
    if cache is None:
        raise OpenAIError(400, "caching is off on this server (--no-cache)", code="cache_disabled")
    return cache


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CacheDep = Annotated[CacheAdmin | None, Depends(get_cache)]
CacheOnDep = Annotated[CacheAdmin, Depends(require_cache)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
