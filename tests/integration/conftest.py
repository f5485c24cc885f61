"""Integration fixtures: a cached and a cold (--no-cache) server on the tiny model."""

from __future__ import annotations

import logging
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


@pytest.fixture(autouse=True)
def store_log_levels() -> Iterator[None]:
    """The ``store`` loggers' levels as they were before the test: a ``kvproxy cache`` command run
    in this process (``CliRunner``) quiets them, as it does in a process of its own."""
    loggers = [logging.getLogger(name) for name in ("store", "store.index.embedded")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)
