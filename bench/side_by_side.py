"""Cache on vs --no-cache, side by side, in one run; writes docs/benchmarks.md.

Starts two `kvproxy serve` processes on the same model (one with the prefix cache, one with
`--no-cache`), measures them one after the other (never at the same time, so they do not share
the CPU), and checks the targets of the project:

- a 2,048-token prompt whose first 2,047 tokens are cached: TTFT at most 1/50 of cold;
- the floor, measured here too: reading that prompt's cached K/V bytes plus one forward pass of
  one token on that past; the cached TTFT is at most 1.5 x the floor;
- the 0%-reuse workload: TTFT and throughput within 3% of --no-cache;
- the index lookup is one round trip whose time does not grow with the entries stored (10 vs
  100,000).

    python bench/side_by_side.py            # about 15 minutes on 2 cores
    python bench/side_by_side.py --quick    # smaller prefixes, a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis
import torch
from openai import OpenAI

from engine.generate import prefill
from engine.kv import past_from_blocks
from engine.loading import load_model
from hashing import BLOCK_SIZE, block_hashes
from proxy import benchmark
from proxy.config import default_cache_dir
from store.blobs import BlobStore
from store.index import RedisIndex, new_entry
from store.serde import decode_block

MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[1]


def serve(port: int, blob_dir: Path, prefix: str, *flags: str) -> subprocess.Popen:
    env = os.environ | {
        "KVPROXY_PORT": str(port),
        "KVPROXY_BLOB_DIR": str(blob_dir),
        "KVPROXY_KEY_PREFIX": prefix,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError(f"kvproxy on port {port} did not start")


def ttft(url: str, prompt: list[int]) -> float:
    """Seconds to the first streamed token of a token-id completion."""
    start = time.perf_counter()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - start
    raise RuntimeError("no token")


def floor(blob_dir: Path, prefix: str, prompt: list[int]) -> tuple[float, float]:
    """(seconds to read the cached K/V bytes, seconds of one forward pass of one token on them),
    each the median of 5, in this process."""
    loaded = load_model(MODEL, cache_dir=Path(os.environ.get("KVPROXY_CACHE_DIR", default_cache_dir())))
    namespace = next(p.name for p in blob_dir.iterdir() if p.is_dir())
    ns = bytes.fromhex(namespace)
    hashes = block_hashes(prompt, ns)  # type: ignore[arg-type]
    blobs = BlobStore(blob_dir)
    paths = [blob_dir / blobs.relative_path(ns, h) for h in hashes]  # type: ignore[arg-type]
    reads, forwards = [], []
    for _ in range(5):
        start = time.perf_counter()
        data = [p.read_bytes() for p in paths]
        reads.append(time.perf_counter() - start)
        blocks = [
            decode_block(
                d,
                index=i,
                block_hash=h,
                parent=hashes[i - 1] if i else None,
                namespace=ns,  # type: ignore[arg-type]
                token_ids=prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE],
                spec=loaded.kv_spec,
            )
            for i, (d, h) in enumerate(zip(data, hashes, strict=True))
        ]
        past = past_from_blocks(blocks, len(prompt) - 1)
        start = time.perf_counter()
        prefill(loaded.model, prompt[-1:], past, len(prompt) - 1)
        forwards.append(time.perf_counter() - start)
    return statistics.median(reads), statistics.median(forwards)


def lookup_scaling(redis_url: str) -> dict[int, float]:
    """Median seconds of a 16-block chain lookup with 10 and with 100,000 entries stored."""
    client = redis.Redis.from_url(redis_url)
    out = {}
    for stored in (10, 100_000):
        prefix = f"kvpbench-{stored}-{random.getrandbits(32):08x}:"
        index = RedisIndex(client, prefix)
        ns = bytes(16)
        pipe = client.pipeline(transaction=False)
        for i in range(stored):
            h = i.to_bytes(16, "little")
            pipe.set(index.block_key(ns, h), new_entry("x", 1, None).to_json(), ex=600)  # type: ignore[arg-type]
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        chain = block_hashes(list(range(16 * BLOCK_SIZE)), ns)  # type: ignore[arg-type]
        times = []
        for _ in range(300):
            start = time.perf_counter()
            index.match(ns, chain, 600)  # type: ignore[arg-type]
            times.append(time.perf_counter() - start)
        out[stored] = statistics.median(times)
        for batch in [list(client.scan_iter(match=f"{prefix}*", count=10000))]:
            for i in range(0, len(batch), 10000):
                client.delete(*batch[i : i + 10000])
    return out


def run_workloads(url: str, workloads: list[benchmark.Workload], concurrency: int) -> list[benchmark.Summary]:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)
    return [benchmark.run(client, MODEL, w, concurrency=concurrency, max_tokens=16) for w in workloads]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="prefixes of 512 and 1024 tokens only")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kvproxy-bench-"))
    prefix = f"kvpbench-{random.getrandbits(32):08x}:"
    cached_url, cold_url = "http://127.0.0.1:8601", "http://127.0.0.1:8602"
    servers = [
        serve(8601, work / "blobs", prefix),
        serve(8602, work / "blobs-off", prefix + "off:", "--no-cache"),
    ]
    sizes = [512, 1024] if args.quick else [512, 1024, 2048, 4096]
    try:
        rng = random.Random(0)
        prompt = [rng.randrange(100, 40000) for _ in range(2048)]
        cold = statistics.median(ttft(cold_url, prompt) for _ in range(2))
        ttft(cached_url, prompt)  # stores the 16 blocks
        time.sleep(3)
        warm = statistics.median(ttft(cached_url, prompt) for _ in range(5))
        read_s, forward_s = floor(work / "blobs", prefix, prompt)
        lookups = lookup_scaling(args.redis_url)

        workloads = benchmark.workloads(["all"], 0, sizes, "all")
        results = {
            label: run_workloads(url, workloads, 1)
            for label, url in (("cache", cached_url), ("no-cache", cold_url))
        }
        conc = {
            c: run_workloads(cached_url, [benchmark.zero_reuse(7, requests=8, prompt_tokens=256)], c)[0]
            for c in (1, 4)
        }
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(60)

    write_report(Path(args.out), cold, warm, read_s, forward_s, lookups, results, conc)
    print(Path(args.out).read_text())


def write_report(out, cold, warm, read_s, forward_s, lookups, results, conc) -> None:  # noqa: ANN001
    floor_s = read_s + forward_s
    control = {label: next(s for s in rs if s.workload == "zero-reuse") for label, rs in results.items()}
    ttft_ratio = control["cache"].ttft_p50_s / control["no-cache"].ttft_p50_s
    tput_ratio = control["cache"].output_tokens_per_s / control["no-cache"].output_tokens_per_s
    growth = lookups[100_000] / lookups[10]
    ms = 1000
    vs_cold = f"{warm * ms:.0f} ms vs cold {cold:.2f} s = 1/{cold / warm:.0f}"
    vs_floor = (
        f"{warm * ms:.0f} ms vs floor {floor_s * ms:.0f} ms "
        f"({read_s * ms:.0f} read + {forward_s * ms:.0f} forward) = {warm / floor_s:.2f} x"
    )
    flat = f"{lookups[10] * ms:.2f} ms (10) vs {lookups[100_000] * ms:.2f} ms (100,000)"
    tput = f"{conc[4].output_tokens_per_s:.1f} vs {conc[1].output_tokens_per_s:.1f} tok/s"
    targets = [
        ("2,048-token prompt, 2,047 cached: TTFT <= cold / 50", vs_cold, cold / warm >= 50),
        ("cached TTFT <= 1.5 x floor (read K/V + one-token forward)", vs_floor, warm <= 1.5 * floor_s),
        ("0%-reuse TTFT within 3% of --no-cache", f"{ttft_ratio:.3f} x", abs(ttft_ratio - 1) <= 0.03),
        ("0%-reuse throughput within 3% of --no-cache", f"{tput_ratio:.3f} x", abs(tput_ratio - 1) <= 0.03),
        ("lookup: one round trip, flat in entries stored", flat, growth < 1.5),
        (
            "concurrency 4 throughput > concurrency 1",
            tput,
            conc[4].output_tokens_per_s > conc[1].output_tokens_per_s,
        ),
    ]
    lines = [
        "# Benchmarks",
        "",
        "Produced by `python bench/side_by_side.py` in one run: a cache-on and a `--no-cache` server on the",
        "same model, measured one after the other. Speed is never asserted in tests; this page is where the",
        "targets are checked.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}; model {MODEL} (float32).",
        "",
        "## Targets",
        "",
        "| Target | Measured | Met |",
        "| --- | --- | --- |",
        *[f"| {name} | {value} | {'yes' if ok else 'no'} |" for name, value, ok in targets],
        "",
        "## Workloads (concurrency 1, 16 output tokens, seed 0)",
        "",
        "| Workload | Server | TTFT p50 s | TTFT p95 s | Latency p50 s | Output tok/s | Hit rate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(results["cache"], results["no-cache"], strict=True):
        for label, s in (("cache", a), ("no-cache", b)):
            lines.append(
                f"| {s.workload} | {label} | {s.ttft_p50_s:.3f} | {s.ttft_p95_s:.3f} | {s.latency_p50_s:.3f} "
                f"| {s.output_tokens_per_s:.1f} | {s.hit_rate:.1%} |"
            )
        lines.append(f"| {a.workload} | **ratio** | **{b.ttft_p50_s / a.ttft_p50_s:.1f}x faster** | | | | |")
    lines += [
        "",
        "## Reproduce",
        "",
        "```bash",
        "python bench/side_by_side.py",
        "kvproxy bench --base-url http://127.0.0.1:8000/v1   # against any server",
        "```",
        "",
    ]
    out.write_text("\n".join(lines))
    (out.parent / "benchmarks.json").write_text(
        json.dumps({"targets": [t[:2] + (bool(t[2]),) for t in targets]}, indent=2)
    )


if __name__ == "__main__":
    main()
