"""The cache's own targets, cache on vs ``--no-cache`` on the same model and format:

- a 2,048-token prompt whose first 2,047 tokens are cached: TTFT at most 1/50 of cold;
- the floor: reading that prompt's cached K/V bytes plus the server's compute of its one
  uncached token; the cached TTFT is at most 1.5 x the floor;
- the 0%-reuse workload: TTFT and throughput within 3% of ``--no-cache``;
- the lookup stage of a hit (one Redis round trip, blocks from the RAM tier) does not grow with
  the keys Redis holds (10 vs 100,000).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from bench import client as bench_client
from bench import workloads as bench_workloads
from bench.client import Summary
from bench.servers import running, serve

MODEL = "smollm2-135m-instruct"


HTTP = httpx.Client(timeout=600)
"""One client for every timed request: a new client per request would add its own set-up (an SSL
context, a connection) to each measured time."""


def ttft(url: str, prompt: list[int]) -> float:
    """Seconds to the first streamed token of a token-id completion."""
    return timed_first_token(url, prompt)[0]


def timed_first_token(url: str, prompt: list[int]) -> tuple[float, dict]:
    """Seconds to the first streamed token of a token-id completion, and the server's own
    explanation of it (``x-kvproxy-explain``: cached tokens, lookup and prefill seconds)."""
    start = time.perf_counter()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    headers = {"x-kvproxy-explain": "1"}
    with HTTP.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - start, json.loads(r.headers["x-kvproxy-explain"])
    raise RuntimeError("no token")


def floor(url: str, blob_dir: Path, prompt: list[int]) -> tuple[float, float]:
    """(seconds to read the bytes of every blob the cache stored for ``prompt``, seconds the server
    spent computing the one uncached token of it), each the median of 5.

    The read is plain file I/O here; the compute is what the server reports for a full hit
    (prefill seconds minus the lookup stage's seconds).
    """
    paths = sorted(blob_dir.glob("*/*/*.safetensors"))
    reads, computes = [], []
    for _ in range(5):
        start = time.perf_counter()
        for path in paths:
            path.read_bytes()
        reads.append(time.perf_counter() - start)
        _, explained = timed_first_token(url, prompt)
        computes.append(explained["prefill_seconds"] - explained["load_seconds"])
    return statistics.median(reads), statistics.median(computes)


def lookup_scaling(url: str, redis_url: str, prompt: list[int]) -> dict[int, float]:
    """Median seconds of the server's lookup stage for a cached 2,048-token prompt (RAM tier: one
    Redis round trip and no blob read) with 10 and with 100,000 other keys in its Redis."""
    client = redis.Redis.from_url(redis_url)
    prefix = f"kvpbench-filler-{random.getrandbits(32):08x}:"
    out = {}
    for stored in (10, 100_000):
        pipe = client.pipeline(transaction=False)
        for i in range(stored):
            pipe.set(f"{prefix}{i}", "x" * 100, ex=600)
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        out[stored] = statistics.median(timed_first_token(url, prompt)[1]["load_seconds"] for _ in range(50))
        keys = list(client.scan_iter(match=f"{prefix}*", count=10000))
        for i in range(0, len(keys), 10000):
            client.delete(*keys[i : i + 10000])
    return out


def run_workloads(
    url: str, workloads: list[bench_workloads.Workload], concurrency: int, max_tokens: int = 16
) -> list[Summary]:
    client = bench_client.Client(f"{url}/v1")
    return [
        bench_client.run(client, MODEL, w, concurrency=concurrency, max_tokens=max_tokens) for w in workloads
    ]


def control(urls: dict[str, str]) -> tuple[dict[str, Summary], float]:
    """The 0%-reuse control: the same unique prompts to both servers, alternating request by
    request (which goes first alternates), so drift in the machine's speed hits both alike.

    Returns:
        Per server a summary whose throughput is output tokens over the summed request latencies,
        and the median over prompts of the paired TTFT ratio cache / no-cache.
    """
    sessions = bench_workloads.zero_reuse(11, requests=32, prompt_tokens=512).sessions
    results: dict[str, list[bench_client.Result]] = {label: [] for label in urls}
    for i, session in enumerate(sessions):
        labels = list(urls) if i % 2 == 0 else list(urls)[::-1]
        for label in labels:
            workload = bench_workloads.Workload("zero-reuse", [session])
            results[label] += run_workloads(urls[label], [workload], 1)[0].results
    busy = {label: sum(r.latency_s for r in rs) for label, rs in results.items()}
    summaries = {
        label: bench_client.summarize("zero-reuse", rs, busy[label]) for label, rs in results.items()
    }
    pairs = zip(results["cache"], results["no-cache"], strict=True)
    return summaries, statistics.median(c.ttft_s / o.ttft_s for c, o in pairs)


def measure_cache(
    urls: dict[str, str], work: Path, prefix: str, redis_url: str, sizes: list[int]
) -> dict[str, Any]:
    """Every measurement of the cache's targets, on a cache server and a ``--no-cache`` one."""
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40000) for _ in range(2048)]
    cold = statistics.median(ttft(urls["no-cache"], prompt) for _ in range(3))
    ttft(urls["cache"], prompt)  # stores the 16 blocks
    time.sleep(3)
    warm = statistics.median(ttft(urls["cache"], prompt) for _ in range(7))
    # the same blocks served by a process without a RAM tier: from the blob store
    with running(serve(8603, work / "blobs", prefix, "--ram-cache-bytes", "0")):
        from_disk = statistics.median(ttft("http://127.0.0.1:8603", prompt) for _ in range(7))
    read_s, forward_s = floor(urls["cache"], work / "blobs", prompt)
    lookups = lookup_scaling(urls["cache"], redis_url, prompt)
    workloads = bench_workloads.workloads(["shared", "multiturn", "docqa"], 0, sizes, "all")
    results = {label: run_workloads(url, workloads, 1) for label, url in urls.items()}
    zero, zero_ttft_ratio = control(urls)
    concurrency_workload = bench_workloads.zero_reuse(7, requests=8, prompt_tokens=256)
    conc = {
        (label, c): run_workloads(url, [concurrency_workload], c, max_tokens=64)[0]
        for label, url in urls.items()
        for c in (1, 4)
    }
    timings = {"cold": cold, "warm": warm, "from_disk": from_disk, "read": read_s, "forward": forward_s}
    return {
        "timings": timings,
        "lookups": lookups,
        "results": results,
        "control": (zero, zero_ttft_ratio),
        "conc": conc,
    }
