"""Services live on ``app.state``; routes reach them through these one-line accessors."""

from __future__ import annotations

from fastapi import Request

from engine.worker import Engine
from proxy.config import Settings
from store.cache import BlockCache


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_cache(request: Request) -> BlockCache | None:
    return request.app.state.cache
