"""Concurrency: simultaneous identical and different prompts, and clients that leave."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from hashing import block_hashes
from tests.api import Api
from tests.helpers import random_tokens, wait_for


def check_store_is_consistent(api: Api, settings, redis_client, key_prefix: str) -> None:
    """No temp or partial file; every index entry has a blob that verifies, every blob an entry."""
    root = settings.blob_root
    assert not [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".safetensors")]
    entries = {k.decode().rsplit(":", 1)[-1] for k in redis_client.scan_iter(match=f"{key_prefix}*:b:*")}
    blobs = {p.stem for p in root.rglob("*.safetensors")}
    assert entries == blobs


def test_simultaneous_clients_get_their_own_cold_answers(cached, cold, settings, redis_client, key_prefix):
    """Eight clients send one new long prompt at once, among clients with other prompts, then a second
    wave 10 ms apart: every answer equals its cold answer, one blob per block, no 5xx."""
    shared = random_tokens(700, seed=21)
    others = [random_tokens(200 + 50 * i, seed=30 + i) for i in range(4)]
    first_wave = [shared] * 8 + others
    expected = {tuple(p): cold.complete(p).key for p in [shared, *others]}

    def send(prompt: list[int], delay_s: float = 0.0):
        time.sleep(delay_s)
        return prompt, cached.complete(prompt)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(send, first_wave))
        results += list(pool.map(send, [shared] * 8, [0.01 * i for i in range(8)]))

    assert all(r.status == 200 for _, r in results)
    for prompt, result in results:
        assert result.key == expected[tuple(prompt)]
    cached.flush()
    namespace = cached.engine.loaded.namespace("default")
    # prompt blocks of every prompt, plus blocks completed by the generated tokens
    stored = {p.stem for p in settings.blob_root.rglob("*.safetensors")}
    assert {h.hex() for h in block_hashes(shared, namespace)} <= stored
    check_store_is_consistent(cached, settings, redis_client, key_prefix)


def wait_idle(api: Api) -> float:
    """Seconds until the engine is idle (printed by the tests, never asserted)."""
    start = time.monotonic()
    wait_for(lambda: api.engine.idle, what="generation to stop")
    return time.monotonic() - start


def abandon_once_computing(api: Api, body: dict) -> None:
    """Send ``body`` to ``/v1/completions`` and close the connection once the engine has admitted
    it (however long that took), unanswered."""
    payload = json.dumps(body).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", api.server.port)) as client:
        client.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_for(lambda: api.engine.running, what="the engine to admit the request")


def test_client_leaving_during_prefill_stops_it(settings, default_model, serve, redis_client, key_prefix):
    """A 2,000-token prompt abandoned during its prefill: the prefill is not finished, nothing
    partial is stored, and the worker goes idle again."""
    prompt = random_tokens(2000, seed=41)
    with serve(settings, default_model) as server:
        api = Api(server, model=default_model.name)
        body = {"model": default_model.name, "prompt": prompt, "max_tokens": 50}
        for stream in (False, True):
            before = api.engine.stats().prefill_tokens
            abandon_once_computing(api, body | {"stream": stream})
            waited = wait_idle(api)
            print(f"stream={stream}: worker idle {waited:.2f} s after the client left during prefill")
            assert api.engine.stats().prefill_tokens == before  # prefill never completed
        api.flush()
        check_store_is_consistent(api, settings, redis_client, key_prefix)
        assert api.complete(prompt[:300], max_tokens=2).status == 200  # still serving


def test_client_leaving_mid_stream_stops_decoding(settings, default_model, serve, redis_client, key_prefix):
    """A stream of up to 400 tokens closed after 5 chunks: decoding stops soon after."""
    prompt = random_tokens(300, seed=42)
    with serve(settings, default_model) as server:
        api = Api(server, model=default_model.name)
        body = {
            "model": default_model.name,
            "prompt": prompt,
            "max_tokens": 400,
            "stream": True,
            "temperature": 1.0,
            "seed": 1,
        }
        before = api.engine.stats().decode_tokens
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            for _ in range(5):
                next(lines)
        waited = wait_idle(api)
        decoded = api.engine.stats().decode_tokens - before
        print(f"worker idle {waited:.2f} s after the client left mid-stream; {decoded} tokens decoded")
        assert decoded < 100
        api.flush()
        check_store_is_consistent(api, settings, redis_client, key_prefix)
