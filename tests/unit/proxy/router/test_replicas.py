"""The router's probe lists each replica's models with the first of its ``--api-keys``; a replica
that refuses gets one warning while it refuses, not one per probe, and is asked again only after
``REFUSED_RETRY_S``."""

from __future__ import annotations

import asyncio
import logging

import httpx

from proxy.router import replicas as replicas_module
from proxy.router.replicas import Replicas, probe_key

URL = "http://replica:8000/v1"


def test_the_probe_key_is_the_first_api_key_given(tmp_path) -> None:
    """``ka=alice,kb=bob``: ``ka``; a file first: its first key (comments skipped); no keys: None."""
    keys = tmp_path / "keys"
    keys.write_text("# the team\nkf=frank\nkg\n")
    assert probe_key("ka=alice,kb=bob") == "ka"
    assert probe_key(f"{keys},ka") == "kf"
    assert probe_key(None) is None and probe_key(" ") is None


def probe_times(answers: list[int], times: int) -> tuple[list[set[str]], list[str | None]]:
    """Probe one replica ``times`` times, its model listings answered with the statuses
    ``answers`` in turn: the models known after each probe, and each listing's Authorization."""
    statuses = iter(answers)
    sent = []

    def replica(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        sent.append(request.headers.get("authorization"))
        status = next(statuses)
        body = {"data": [{"id": "alpha"}]} if status == 200 else {"error": {"message": "Missing API key"}}
        return httpx.Response(status, json=body)

    async def probe() -> list[set[str]]:
        replicas = Replicas([URL], connect_timeout_s=1, cooldown_s=1, probe_key="ka")
        one = replicas.all[0]
        await one.client.aclose()
        one.client = httpx.AsyncClient(transport=httpx.MockTransport(replica))
        seen = []
        for _ in range(times):
            assert await replicas.probe(one) == (True, False)
            seen.append(set(one.models))
        await replicas.close()
        return seen

    return asyncio.run(probe()), sent


def test_a_refusing_replica_is_warned_about_once_until_it_lists_its_models(caplog, monkeypatch) -> None:
    """Three probes answered 401: one warning (the replica, the status, the variable to set), no
    models; then a 200 lists ``alpha``; then a 401 again: a second warning, ``alpha`` kept. Every
    listing is asked with ``Authorization: Bearer ka`` (asked again at once here)."""
    monkeypatch.setattr(replicas_module, "REFUSED_RETRY_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="route"):
        models, sent = probe_times([401, 401, 401, 200, 401, 401], 6)
    assert models == [set(), set(), set(), {"alpha"}, {"alpha"}, {"alpha"}]
    assert sent == ["Bearer ka"] * 6
    warnings = [r.getMessage() for r in caplog.records if r.name == "route"]
    assert len(warnings) == 2, warnings
    assert all(
        w.startswith(f"replica {URL} refuses to list its models")
        and "401 Unauthorized" in w
        and "KVPROXY_API_KEYS" in w
        for w in warnings
    ), warnings


def test_a_refusing_replica_is_not_asked_again_at_every_probe() -> None:
    """After a refusal, the probes within ``REFUSED_RETRY_S`` (60 s) check its health only: one
    refused request in its log, not one every probe."""
    models, sent = probe_times([401], 5)
    assert models == [set()] * 5 and sent == ["Bearer ka"]
