"""Several processes: two `kvproxy serve` processes on one index (one Redis, a Redis Cluster,
Sentinel) and one blob store (a directory, an S3 bucket)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from store.blobs.file import FileBlobStore
from tests.helpers import HANG_S, free_port, random_tokens, wait_for
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
            # NOTE: a Redis reply later than the default 0.25 s (a loaded machine) is a failure
            # that drops the counts in flight: the sums below would never add up
            "KVPROXY_REDIS_TIMEOUT": "10",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def answers(url: str) -> bool:
    """Whether a server at ``url`` answers ``/health`` (not yet, while it loads the model)."""
    try:
        return httpx.get(f"{url}/health", timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


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
            wait_for(lambda url=url: answers(url), HANG_S, f"kvproxy serve at {url} to start")
        yield urls, httpx.get(f"{urls[0]}/v1/models", timeout=60).json()["data"][0]["id"]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(HANG_S)


def test_two_processes_share_the_cache_and_add_up(two_servers, redis_client, key_prefix, blob_store):
    """A prefix stored by one is a hit on the other; with both writing the same blocks and both
    collecting garbage every 0.3 s, no indexed blob is ever lost; their stats add up."""
    (a, b), model = two_servers
    prompt = random_tokens(300, seed=101)
    first = complete(a, model, prompt)
    reused = len(prompt) - 1  # A's 2 blocks, then its prompt's tail

    def hit_on_b() -> dict | None:
        hit = complete(b, model, prompt)
        return hit if hit["usage"]["prompt_tokens_details"]["cached_tokens"] == reused else None

    # NOTE: A saves in the background; B hits once A's writer has published
    hit = wait_for(hit_on_b, HANG_S, "B to see A's blocks and tail")
    assert hit["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]

    prompts = [random_tokens(200 + 40 * i, seed=110 + i) for i in range(6)]
    jobs = [(url, p) for p in prompts for url in (a, b)] * 2
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: complete(job[0], model, job[1]), jobs))

    def added_up() -> list[int] | None:
        """Both processes' engine totals (prompt and cached tokens), once the deployment's counters
        (each process's writer adds to them in the background) have caught up with them."""
        per_process = [httpx.get(f"{u}/v1/cache/stats", timeout=60).json() for u in (a, b)]
        totals = [
            sum(p["process"]["engine"][k] for p in per_process) for k in ("prompt_tokens", "cached_tokens")
        ]
        deployment = per_process[0]["deployment"]
        # NOTE: a counter no writer has added to yet is absent
        caught_up = [deployment.get("prompt_tokens", 0), deployment.get("cached_tokens", 0)] == totals
        return totals if caught_up else None

    engine_totals = wait_for(added_up, HANG_S, "the deployment's counters to add up to the processes' totals")
    for url in (a, b, a, b):  # NOTE: collections surely run after the writes (the collectors' own may lag)
        assert httpx.post(f"{url}/v1/cache/gc", timeout=HANG_S).status_code == 200

    entries = {k.decode().rsplit(":", 1)[-1] for k in redis_client.scan_iter(match=f"{key_prefix}*:b:*")}
    blobs = {b.block_hash.hex() for b in blob_store.scan() if b.block_hash is not None}
    assert entries and entries <= blobs  # every entry's blob is there

    sent_prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in results)
    sent_prompt_tokens += first["usage"]["prompt_tokens"]
    sent_cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)
    sent_cached += first["usage"]["prompt_tokens_details"]["cached_tokens"]
    # (B also answered the polling requests above, so the totals include a few more)
    assert engine_totals[0] >= sent_prompt_tokens and engine_totals[1] >= sent_cached
