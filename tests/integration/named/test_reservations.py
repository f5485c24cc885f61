"""Named caches made at once, on real servers sharing one Redis and the tiny model: a create
reserves its bytes before its work, so a tenant's creates under way never take it past its share
of ``--max-pinned-bytes``, nor make another tenant's create a "full" 429; a create that fails or is
refused leaves nothing reserved (``proxy.named.ledger``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxy.named.ledger import Limits, Refusal
from proxy.named.registry import MemoryNamedCaches, NamedCache, RedisNamedCaches, tenant_digest
from tests.replicas import text

KEYS = "key-a=alice,key-b=bob,key-c=carol"


def create(server, key: str, seed: int, words: int = 100) -> httpx.Response:
    """POST a one-block named cache (100 words: about 160 tokens of the tiny tokenizer)."""
    body = {
        "model": "models/tiny",
        "contents": [{"role": "user", "parts": [{"text": text(seed, words)}]}],
        "ttl": "600s",
    }
    headers = {"x-goog-api-key": key}
    return httpx.post(f"{server.base_url}/v1beta/cachedContents", json=body, headers=headers, timeout=120)


def held(server, key: str) -> int:
    """Bytes ``key``'s tenant's named caches pin (as recorded)."""
    listing = httpx.get(
        f"{server.base_url}/v1beta/cachedContents", headers={"x-goog-api-key": key}, timeout=60
    )
    return sum(int(c["usageMetadata"]["cachedBlockBytes"]) for c in listing.json().get("cachedContents", []))


def test_concurrent_creates_stay_within_the_share_and_leave_room_for_others(
    settings, tiny_model, serve, redis_client, key_prefix
) -> None:
    """``--max-pinned-bytes`` of six blocks, a third each: B holds two one-block caches; C sends
    eight one-block creates at once, half to each of two replicas, and A one meanwhile. C ends
    within its share (each create a 200 or a 429 naming the share), A's create is a 200, and
    nothing stays reserved."""
    block = tiny_model.kv_spec.block_bytes
    update = {"api_keys": KEYS, "admin_key": "admin", "max_pinned_bytes": 6 * block, "tenant_share": 1 / 3}
    keyed = settings.model_copy(update=update)
    with serve(keyed, tiny_model) as one, serve(keyed, tiny_model) as two:
        assert [create(one, "key-b", s).status_code for s in (1, 2)] == [200, 200]
        with ThreadPoolExecutor(9) as pool:
            carols = [pool.submit(create, (one, two)[i % 2], "key-c", 10 + i) for i in range(8)]
            time.sleep(0.2)
            alices = pool.submit(create, two, "key-a", 30)
            answers = [f.result() for f in carols]
            alice = alices.result()
        codes = sorted(r.status_code for r in answers)
        assert set(codes) <= {200, 429} and 200 in codes, [(r.status_code, r.text[:200]) for r in answers]
        assert held(one, "key-c") <= (6 * block) // 3, codes
        assert alice.status_code == 200, alice.text[:300]
        for refused in (r for r in answers if r.status_code == 429):
            assert "share" in refused.json()["error"]["message"], refused.text
        assert not redis_client.hlen(f"{key_prefix}{{named}}:held")


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_the_ledger_charges_reservations_and_frees_them(backend, redis_client, key_prefix) -> None:
    """A reservation counts against its tenant's share and the budget until it is committed (then
    the record counts, with its real bytes) or released; a record deleted while its expiry was
    being changed stays deleted, its bytes no longer charged."""
    named = RedisNamedCaches(redis_client, key_prefix) if backend == "redis" else MemoryNamedCaches()
    limits = Limits(share=100, budget=200)
    assert named.reserve("carol", "t1", 60, limits) is None
    assert named.reserve("carol", "t2", 60, limits) == Refusal("share", 60)  # NOTE: t1 is under way
    assert named.reserve("alice", "t3", 90, limits) is None
    assert named.reserve("bob", "t4", 90, limits) == Refusal("budget", 0)  # NOTE: 150 reserved
    named.release("alice", "t3")
    assert named.reserve("bob", "t4", 90, limits) is None
    record = NamedCache("c1", "tiny", "", [], "00", ["11"], 130, 50, 0.0, 0.0, time.time() + 600)
    assert named.commit("carol", "t1", record, limits) is None
    assert named.reserve("carol", "t5", 60, limits) == Refusal("share", 50)  # NOTE: the record's 50
    assert named.reserve("carol", "t5", 50, limits) is None
    named.release("carol", "t5")
    assert named.delete(tenant_digest("carol"), "c1") is not None
    assert not named.replace("carol", record)  # NOTE: a PATCH after the delete
    assert named.get("carol", "c1") is None
    assert named.reserve("carol", "t6", 100, limits) is None
    assert named.commit("bob", "t4", record, Limits(100, 140)) == Refusal("budget", 0)  # NOTE: t6
