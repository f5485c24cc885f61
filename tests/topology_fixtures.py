"""Fixtures of the Redis topologies (``tests.topologies``): one Redis Cluster and one Sentinel
set per test session, and ``TOPOLOGIES``, with which a test module runs on each of them.

    @pytest.fixture(params=TOPOLOGIES)
    def redis_url(request):
        return topology_url(request)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.topologies import LocalCluster, LocalSentinel

TOPOLOGIES = ["redis", "cluster", "sentinel"]


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A 3-master Redis Cluster on free ports, shared by the session's tests."""
    cluster = LocalCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[LocalSentinel]:
    """A master, a replica and three sentinels, shared by the session's tests (never failed)."""
    sentinel = LocalSentinel().start()
    yield sentinel
    sentinel.stop()


def topology_url(request: pytest.FixtureRequest) -> str:
    """The ``--redis-url`` of the topology ``request.param`` names (started on first use)."""
    if request.param == "cluster":
        return request.getfixturevalue("redis_cluster").url
    if request.param == "sentinel":
        return request.getfixturevalue("redis_sentinel").url
    from tests.conftest import shared_redis_url

    return shared_redis_url()
