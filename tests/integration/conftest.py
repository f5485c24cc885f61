"""Integration fixtures: a cached and a cold (--no-cache) server on the tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api import Api


@pytest.fixture
def cached(settings, tiny_model, serve) -> Iterator[Api]:
    with serve(settings, tiny_model) as server:
        yield Api(server)


@pytest.fixture
def cold(settings, tiny_model, serve) -> Iterator[Api]:
    with serve(settings.model_copy(update={"no_cache": True}), tiny_model) as server:
        yield Api(server)
