"""The state stores (named caches, stored responses) open by ``--redis-url``'s scheme, as the
block index does: in this process for ``memory://``, else on Redis with their own timeout."""

from __future__ import annotations

from proxy.config import STATE_TIMEOUT_S, Settings
from proxy.named.registry import MemoryNamedCaches, RedisNamedCaches
from proxy.responses.state import MemoryResponses, RedisResponses
from proxy.stores import open_named, open_responses


def test_memory_url_keeps_state_in_this_process() -> None:
    """``memory://``: both stores live in this process, the responses with their budgets."""
    settings = Settings(redis_url="memory://", responses_max_bytes=1000)
    assert isinstance(open_named(settings), MemoryNamedCaches)
    responses = open_responses(settings)
    assert isinstance(responses, MemoryResponses)
    assert (responses.ttl_s, responses.max_bytes) == (settings.responses_ttl, 1000)


def test_a_redis_url_opens_redis_with_the_state_timeout() -> None:
    """A Redis URL: both stores on Redis (nothing contacted yet), each operation bounded by the
    longer of ``--redis-timeout`` and ``STATE_TIMEOUT_S``."""
    settings = Settings(redis_url="redis://127.0.0.1:1/0", redis_timeout=0.25, key_prefix="kvp-test:")
    named, responses = open_named(settings), open_responses(settings)
    assert isinstance(named, RedisNamedCaches) and named.base == "kvp-test:{named}:"
    assert isinstance(responses, RedisResponses) and responses.base == "kvp-test:{responses}:"
    for client in (named.client, responses.client):
        assert client.connection_pool.connection_kwargs["socket_timeout"] == STATE_TIMEOUT_S
