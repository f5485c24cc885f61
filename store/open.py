"""Backends by URL scheme: the block index ``--redis-url`` names and the blob store ``--blob-url``
names, each through one registry. A backend's modules are imported inside its factory, so opening
a directory never imports boto3 and opening Redis never imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import urlsplit
from urllib.request import url2pathname

from store.blobs.base import BlobBackend
from store.index.base import BlockIndex
from store.index.redis.schemes import SCHEMES as REDIS_SCHEMES

IndexFactory = Callable[[str, str, float], BlockIndex]
"""``(url, key prefix, timeout in seconds) -> index`` (nothing is contacted yet)."""
BlobsFactory = Callable[[str, float], BlobBackend]
"""``(url, read timeout in seconds) -> blob store`` (nothing is contacted yet)."""

F = TypeVar("F")


class Registry(Generic[F]):
    """Factories by URL scheme (as mini-sglang's ``Registry``)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.factories: dict[str, F] = {}

    def register(self, *schemes: str) -> Callable[[F], F]:
        """A decorator: the factory for URLs of these schemes."""

        def add(factory: F) -> F:
            self.factories.update(dict.fromkeys(schemes, factory))
            return factory

        return add

    def factory(self, url: str) -> F:
        """The factory for ``url``'s scheme.

        Raises:
            ValueError: no backend registered for it.
        """
        found = self.factories.get(urlsplit(url).scheme)
        if found is None:
            known = ", ".join(f"{s}://" for s in sorted(self.factories))
            raise ValueError(f"{url!r}: the {self.what} URL's scheme must be one of {known}")
        return found


INDEXES: Registry[IndexFactory] = Registry("index")
BLOBS: Registry[BlobsFactory] = Registry("blob store")


@INDEXES.register("memory")
def _memory_index(_url: str, _key_prefix: str, _timeout_s: float) -> BlockIndex:
    from store.index.memory.index import MemoryIndex

    return MemoryIndex()


@INDEXES.register(*REDIS_SCHEMES)
def _redis_index(url: str, key_prefix: str, timeout_s: float) -> BlockIndex:
    from store.index.redis.connect import redis_client
    from store.index.redis.index import RedisIndex

    return RedisIndex(redis_client(url, timeout_s), key_prefix)


@BLOBS.register("file")
def _file_blobs(url: str, _read_timeout_s: float) -> BlobBackend:
    from store.blobs.file import FileBlobStore

    return FileBlobStore(Path(url2pathname(urlsplit(url).path)))


@BLOBS.register("s3")
def _s3_blobs(url: str, read_timeout_s: float) -> BlobBackend:
    from store.blobs.s3 import S3BlobStore, s3_client

    parts = urlsplit(url)
    return S3BlobStore(parts.netloc, parts.path, s3_client(read_timeout_s))


def open_index(url: str, *, key_prefix: str, timeout_s: float) -> BlockIndex:
    """The block index ``url`` names (Redis is not contacted yet).

    Raises:
        ValueError: an unknown scheme (``store.index.redis.connect.RedisURLError`` for a Redis
            URL that cannot be used).
    """
    return INDEXES.factory(url)(url, key_prefix, timeout_s)


def open_blobs(url: str, *, read_timeout_s: float) -> BlobBackend:
    """The blob store ``url`` names (``file:///path`` or ``s3://bucket/prefix``; nothing is
    contacted yet), whose reads time out after ``read_timeout_s`` seconds where the backend can.

    Raises:
        ValueError: an unknown scheme.
    """
    return BLOBS.factory(url)(url, read_timeout_s)
