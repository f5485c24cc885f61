"""Where the block index is: ``--redis-url`` as given, or, by default (``embedded://``), the
embedded Valkey of the cache directory (``store.index.embedded``), joined by this process."""

from __future__ import annotations

import logging
import sys
from typing import TypeVar

import click

from proxy.config import ServerSettings
from store.index.embedded.files import EMBEDDED_URL, EmbeddedIndexError, NoServerBinary
from store.index.embedded.lease import join
from store.index.memory.index import MEMORY_URL
from store.index.redis.connect import redact_url

log = logging.getLogger(__name__)

S = TypeVar("S", bound=ServerSettings)


def with_index(settings: S) -> S:
    """``settings`` with ``redis_url`` naming a server: unchanged unless it is ``embedded://``,
    which becomes the ``unix://`` socket of the embedded index in ``CACHE_DIR/index`` (started or
    joined now).

    Raises:
        store.index.embedded.files.EmbeddedIndexError: the cache directory cannot be written, or
            no server answers there and none can run here (never a silent index of this process
            alone: its garbage collection would take the shared blobs for unindexed).
    """
    if settings.redis_url != EMBEDDED_URL:
        return settings
    try:
        url = join(settings.cache_dir / "index").url
    except NoServerBinary as exc:
        raise EmbeddedIndexError(
            f"no embedded index server can run here ({exc}): give --redis-url for a Redis of your "
            f"own, or {MEMORY_URL} to keep the index in this process alone"
        ) from exc
    return settings.model_copy(update={"redis_url": url})


def located(settings: S) -> S:
    """``with_index`` for the command line: exits 1, saying why, when the embedded index cannot
    be kept in the cache directory."""
    if settings.redis_url != EMBEDDED_URL:
        log.info("index: %s (--redis-url)", redact_url(settings.redis_url))
    try:
        return with_index(settings)
    except EmbeddedIndexError as exc:
        click.echo(f"kvproxy: {exc}", err=True)
        sys.exit(1)
