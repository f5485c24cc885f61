"""Services live on ``app.state``; routes reach them through these accessors, as ``Annotated``
dependency aliases (``EngineDep``, ``CacheDep``, ``SettingsDep``, ``MetricsDep``).

The cache is seen through ``store.interface.CacheAdmin`` only: nothing in proxy/ touches the
store's parts.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.worker import Engine
from proxy.config import Settings
from proxy.metrics import Metrics
from store.admin_interface import CacheAdmin


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_cache(request: Request) -> CacheAdmin | None:
    return request.app.state.cache


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CacheDep = Annotated[CacheAdmin | None, Depends(get_cache)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
