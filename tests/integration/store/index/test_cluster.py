"""kvproxy on a real 3-master Redis Cluster (``tests.topologies``): hits and sharing across
processes, every key of a namespace on one node, tenants spread over nodes, and a node that goes
away turning its lookups into misses. The lifecycle and store suites also run on the cluster
(``TOPOLOGIES``)."""

from __future__ import annotations

from collections import defaultdict

import httpx
import pytest

from proxy.app import create_app
from tests.api import Api
from tests.helpers import HANG_S, ServerThread, random_tokens
from tests.topologies import LocalCluster

PROMPT = random_tokens(600, seed=71)  # four full blocks and a tail


@pytest.fixture
def redis_url(redis_cluster) -> str:
    return redis_cluster.url


def complete(server: ServerThread, prompt, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tiny", "prompt": list(prompt), "max_tokens": 8, "temperature": 0}
    body["return_token_ids"] = True
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_two_processes_share_hits_with_identical_output(settings, tiny_model, serve, redis_cluster) -> None:
    """Server A stores a 600-token prompt's blocks on the cluster; server B (its own process
    state, the same cluster and blob store) hits them and answers exactly as A did cold."""
    with serve(settings, tiny_model) as a, serve(settings, tiny_model) as b:
        cold = Api(a).complete(PROMPT)
        Api(a).flush()
        warm = Api(b).complete(PROMPT)
        again = Api(a).complete(PROMPT)
    assert cold.cached_tokens == 0 and warm.cached_tokens == again.cached_tokens == len(PROMPT) - 1
    assert warm.key == cold.key == again.key


def two_tenants_on_two_nodes(cluster: LocalCluster, model) -> tuple[str, str]:
    """Two tenant names whose namespaces hash to slots on different nodes."""
    by_node: dict[int, str] = {}
    for i in range(64):
        tenant = f"team-{i}"
        by_node.setdefault(cluster.node_of("{" + model.namespace(tenant).hex() + "}"), tenant)
        if len(by_node) == 2:
            break
    first, second = by_node.values()
    return first, second


def test_a_namespace_stays_on_one_node_and_tenants_spread(settings, tiny_model, redis_cluster, redis_client):
    """Each tenant's keys (blocks, accounts, counters) share one hash slot; two tenants whose
    namespaces hash to different nodes are served from those two nodes."""
    tenants = two_tenants_on_two_nodes(redis_cluster, tiny_model)
    by_node = {redis_cluster.node_of("{" + tiny_model.namespace(t).hex() + "}"): t for t in tenants}
    keys = {f"key-{t}": t for t in tenants}
    api_keys = ",".join(f"{k}={t}" for k, t in keys.items())
    with ServerThread(create_app(settings.model_copy(update={"api_keys": api_keys}), tiny_model)) as server:
        for key in keys:
            complete(server, PROMPT, key)
        assert server.app.state.engine.cache.flush(HANG_S)
    nodes_of: dict[str, set[int]] = defaultdict(set)
    slots_of: dict[str, set[int]] = defaultdict(set)
    for raw in redis_client.scan_iter(match=f"{settings.key_prefix}{{*"):
        key = raw.decode()
        ns = key.split("{", 1)[1].split("}", 1)[0]
        nodes_of[ns].add(redis_cluster.node_of(key))
        slots_of[ns].add(redis_client.keyslot(key))
    expected = {tiny_model.namespace(t).hex(): node for node, t in by_node.items()}
    assert dict(nodes_of) == {ns: {node} for ns, node in expected.items()}
    assert all(len(slots) == 1 for slots in slots_of.values())


def test_a_node_that_goes_away_makes_its_lookups_misses(settings, tiny_model, tmp_path) -> None:
    """A private cluster loses the master holding one tenant's namespace: that tenant's requests
    still answer 200 (misses, the same tokens), while another tenant, on a node still up, keeps
    hitting request after request (nothing global stops its lookups)."""
    cluster = LocalCluster().start()
    try:
        lost, kept = two_tenants_on_two_nodes(cluster, tiny_model)
        api_keys = f"key-lost={lost},key-kept={kept}"
        update = {"redis_url": cluster.url, "redis_retry": 0.5, "api_keys": api_keys}
        with ServerThread(create_app(settings.model_copy(update=update), tiny_model)) as server:
            first = {key: complete(server, PROMPT, key) for key in ("key-lost", "key-kept")}
            assert server.app.state.engine.cache.flush(HANG_S)
            cluster.kill(cluster.node_of("{" + tiny_model.namespace(lost).hex() + "}"))
            after = {key: [complete(server, PROMPT, key) for _ in range(3)] for key in first}
    finally:
        cluster.stop()
    cached = {
        k: [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rs] for k, rs in after.items()
    }
    assert cached == {"key-lost": [0, 0, 0], "key-kept": [len(PROMPT) - 1] * 3}  # blocks and tail
    for key, results in after.items():
        assert all(r["choices"][0]["token_ids"] == first[key]["choices"][0]["token_ids"] for r in results)


def test_an_unreachable_cluster_at_start_is_a_miss_not_a_crash(settings, tiny_model) -> None:
    """redis-py's cluster client connects as it is made; kvproxy makes it on first use, so a
    server started while no node answers serves uncached and says so."""
    nowhere = settings.model_copy(update={"redis_url": "redis+cluster://127.0.0.1:1", "redis_retry": 0.5})
    with ServerThread(create_app(nowhere, tiny_model)) as server:
        answer = complete(server, PROMPT)
        health = httpx.get(f"{server.base_url}/health").json()
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and health["cache"] == "degraded"
