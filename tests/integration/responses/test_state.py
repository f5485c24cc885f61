"""Stored responses (``proxy.responses.state``) on one Redis, a Redis Cluster and a Sentinel
set: kept per tenant, the byte budget evicting the oldest first, expiry and deletion told apart
from ids never stored; and the same rules in memory (``memory://``)."""

from __future__ import annotations

import time

import pytest

from proxy.responses.continuation import Continuation
from proxy.responses.state import MemoryResponses, RedisResponses, StoredResponse
from tests.topology_fixtures import TOPOLOGIES, topology_url


@pytest.fixture(params=TOPOLOGIES)
def redis_url(request: pytest.FixtureRequest) -> str:
    return topology_url(request)


def record(response_id: str, words: int = 10) -> StoredResponse:
    after = Continuation([1, 2, 3, 2**32 - 1], 3, "ab")
    conversation = [{"role": "user", "content": "word " * words}]
    return StoredResponse({"id": response_id, "object": "response"}, [], conversation, after)


@pytest.fixture(params=["redis", "memory"])
def store(request, redis_client, key_prefix):
    if request.param == "memory":
        return lambda ttl_s=60, max_bytes=10**6: MemoryResponses(ttl_s, max_bytes)
    return lambda ttl_s=60, max_bytes=10**6: RedisResponses(redis_client, key_prefix, ttl_s, max_bytes)


def test_kept_per_tenant_and_deleted(store) -> None:
    responses = store()
    responses.put("a", record("resp_1"))
    found = responses.get("a", "resp_1")
    assert found == record("resp_1")
    assert found.continuation.token_ids == [1, 2, 3, 2**32 - 1]
    assert responses.get("b", "resp_1") is None
    assert responses.get("a", "resp_2") is None
    assert not responses.delete("b", "resp_1")
    assert responses.delete("a", "resp_1")
    assert responses.get("a", "resp_1") is None


def test_budget_evicts_oldest_and_says_so(store) -> None:
    size = len(record("resp_0", 200).dumps())
    responses = store(max_bytes=3 * size + size // 2)
    for i in range(5):
        responses.put("a", record(f"resp_{i}", 200))
        time.sleep(0.01)
    assert [responses.get("a", f"resp_{i}") == "gone" for i in range(5)] == [True, True, False, False, False]


def test_expired_is_gone(store) -> None:
    responses = store(ttl_s=1)
    responses.put("a", record("resp_1"))
    time.sleep(2.1)
    assert responses.get("a", "resp_1") == "gone"
    assert responses.get("b", "resp_1") is None


@pytest.fixture(params=["redis", "memory"])
def shared(request, redis_client, key_prefix):
    """A store of ``max_bytes`` of which a tenant holds ``tenant_bytes``."""
    if request.param == "memory":
        return lambda max_bytes, tenant_bytes: MemoryResponses(60, max_bytes, tenant_bytes)
    return lambda max_bytes, tenant_bytes: RedisResponses(
        redis_client, key_prefix, 60, max_bytes, tenant_bytes
    )


def test_a_tenant_past_its_share_evicts_its_own_oldest(shared) -> None:
    """A share of two responses in a budget of four: tenant a's fourth evicts a's first two, never
    b's; the budget still holds once more tenants than it has shares for fill theirs (c's second
    makes five: the oldest of all, b's, goes)."""
    size = len(record("resp_0", 200).dumps())
    responses = shared(4 * size + size // 2, 2 * size + size // 2)
    responses.put("b", record("resp_b", 200))
    for i in range(4):
        responses.put("a", record(f"resp_{i}", 200))
        time.sleep(0.01)
    assert [responses.get("a", f"resp_{i}") == "gone" for i in range(4)] == [True, True, False, False]
    assert responses.get("b", "resp_b") == record("resp_b", 200)
    responses.put("c", record("resp_c0", 200))
    assert responses.get("b", "resp_b") == record("resp_b", 200)
    responses.put("c", record("resp_c1", 200))
    assert responses.get("b", "resp_b") == "gone"
    assert [responses.get(t, i) != "gone" for t, i in (("a", "resp_2"), ("c", "resp_c0"))] == [True, True]
    assert responses.delete("c", "resp_c1") and responses.get("c", "resp_c1") is None
