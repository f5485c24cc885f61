"""Several processes: two `kvproxy serve` processes on one index (one Redis, a Redis Cluster,
Sentinel) and one blob store (a directory, an S3 bucket)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from store.blobs.file import FileBlobStore
from tests.helpers import free_port, random_tokens
from tests.topology_fixtures import TOPOLOGIES, topology_url


def blob_env(blobs) -> dict[str, str]:
    """The settings that point a `kvproxy serve` process at ``blobs`` (AWS_* come from the test's
    environment)."""
    if isinstance(blobs, FileBlobStore):
        return {"KVPROXY_BLOB_DIR": str(blobs.root)}
    return {"KVPROXY_BLOB_URL": blobs.url, "KVPROXY_MAX_CACHE_BYTES": "1GB"}


@pytest.fixture(params=TOPOLOGIES)
def redis_url(request) -> str:
    return topology_url(request)


def start(model_dir, port: int, redis_url: str, key_prefix: str, blobs) -> subprocess.Popen:
    env = (
        os.environ
        | blob_env(blobs)
        | {
            "KVPROXY_MODEL": str(model_dir),
            "KVPROXY_PORT": str(port),
            "KVPROXY_REDIS_URL": redis_url,
            "KVPROXY_KEY_PREFIX": key_prefix,
            "KVPROXY_GC_INTERVAL": "0.3",
            "KVPROXY_GC_GRACE": "5",
            "KVPROXY_ALLOW_ANONYMOUS_ADMIN": "1",  # NOTE: /v1/cache/stats, read below
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.HTTPError:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def complete(url: str, model: str, prompt: list[int]) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def two_servers(tiny_model, redis_url, key_prefix, blob_store):
    model_dir = tiny_model.model.name_or_path
    ports = [free_port(), free_port()]
    procs = [start(model_dir, p, redis_url, key_prefix, blob_store) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            wait_up(url)
        yield urls, httpx.get(f"{urls[0]}/v1/models").json()["data"][0]["id"]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)


def test_two_processes_share_the_cache_and_add_up(two_servers, redis_client, key_prefix, blob_store):
    """A prefix stored by one is a hit on the other; with both writing the same blocks and both
    collecting garbage every 0.3 s, no indexed blob is ever lost; their stats add up."""
    (a, b), model = two_servers
    prompt = random_tokens(300, seed=101)
    first = complete(a, model, prompt)
    deadline = time.monotonic() + 30
    reused = len(prompt) - 1  # A's 2 blocks, then its prompt's tail
    while (hit := complete(b, model, prompt))["usage"]["prompt_tokens_details"]["cached_tokens"] != reused:
        assert time.monotonic() < deadline, "B never saw A's blocks and tail"
        time.sleep(0.2)
    assert hit["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]

    prompts = [random_tokens(200 + 40 * i, seed=110 + i) for i in range(6)]
    jobs = [(url, p) for p in prompts for url in (a, b)] * 2
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: complete(job[0], model, job[1]), jobs))
    time.sleep(1.0)  # both collectors run a few more times

    entries = {k.decode().rsplit(":", 1)[-1] for k in redis_client.scan_iter(match=f"{key_prefix}*:b:*")}
    blobs = {b.block_hash.hex() for b in blob_store.scan() if b.block_hash is not None}
    assert entries and entries <= blobs  # every entry's blob is there

    sent_prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in results)
    sent_prompt_tokens += first["usage"]["prompt_tokens"]
    sent_cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)
    sent_cached += first["usage"]["prompt_tokens_details"]["cached_tokens"]
    per_process = [httpx.get(f"{u}/v1/cache/stats").json() for u in (a, b)]
    deployment = per_process[0]["deployment"]
    engine_totals = [
        sum(p["process"]["engine"][k] for p in per_process) for k in ("prompt_tokens", "cached_tokens")
    ]
    assert [deployment["prompt_tokens"], deployment["cached_tokens"]] == engine_totals
    # (B also answered the polling requests above, so the totals include a few more)
    assert engine_totals[0] >= sent_prompt_tokens and engine_totals[1] >= sent_cached
