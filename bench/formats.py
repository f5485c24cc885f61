"""Block formats, measured (``--block-format``): bytes per token at rest, the codec's speed, the
hit TTFT of a 2,048-token prompt from the RAM tier, from file blobs and from S3 (moto, local; and
again through ``--blob-disk-cache``), and the promise sweep against a ``--no-cache`` server,
written into ``docs/benchmarks.md``.

    python -m bench.formats

Starts its own servers on free ports, one at a time, on the default model: per format a server
that computes the prompt and hits it from its RAM tier, one on the same store with no RAM tier
(every hit reads and decodes 16 blobs), the same on an S3 bucket, and one that serves the sweep.
The codec's speed is the servers' own count (``/v1/cache/stats``: bytes encoded and decoded, and the
microseconds it took).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.cache_targets import timed_first_token
from bench.promise import SweepResult, sweep, sweep_prompts
from bench.report import splice
from bench.servers import running, serve, use_s3
from bench.workloads import corpus, text
from tests.topologies import LocalS3

ROOT = Path(__file__).resolve().parents[1]
PORT, COLD_PORT = 8650, 8651
FORMATS_MEASURED = ("exact", "bfloat16", "int8")
MODEL = "smollm2-135m-instruct"
HITS = 7
ADMIN_KEY = "kvproxy-bench-admin"


def cache_stats(url: str) -> dict[str, int]:
    """The server process's cache counters (``/v1/cache/stats`` ``process.cache``)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.get(f"{url}/v1/cache/stats", headers=headers, timeout=30).json()["process"]["cache"]


def hit_ttft(url: str, prompt: list[int]) -> tuple[float, int]:
    """Median TTFT of ``HITS`` hits on ``prompt`` (seconds), and the cached tokens of the last."""
    hits = [timed_first_token(url, prompt) for _ in range(HITS)]
    return statistics.median(t for t, _ in hits), hits[-1][1].get("cached_tokens", 0)


def stored(url: str, prompt: list[int]) -> None:
    """Compute ``prompt`` once and wait until its blocks are written (not only pending)."""
    timed_first_token(url, prompt)
    for _ in range(240):
        if cache_stats(url)["blocks_saved"] >= len(prompt) // 128:
            return
        time.sleep(0.5)
    raise RuntimeError("the prompt's blocks were never saved")


def prose_prompt(url: str, tokens: int = 2048) -> list[int]:
    """``tokens`` token ids of prose (K/V of real text, not of random ids, which compresses
    differently), tokenized by the server."""
    body = {
        "model": MODEL,
        "prompt": text(random.Random(0), tokens + 200, corpus()),
        "add_special_tokens": False,
    }
    ids = httpx.post(f"{url}/tokenize", json=body, timeout=60).json()["tokens"]
    assert len(ids) >= tokens, len(ids)
    return ids[:tokens]


def measure(work: Path, fmt: str, s3_url: str, *flags: str) -> dict[str, Any]:
    """One block format: sizes and codec speed, and the hit TTFT from each tier."""
    prefix = f"kvpfmt-{uuid.uuid4().hex[:8]}:"
    common = ("--block-format", fmt, "--no-tails", "--no-render-ahead", "--admin-key", ADMIN_KEY, *flags)
    url = f"http://127.0.0.1:{PORT}"
    out: dict[str, Any] = {}
    with running(serve(PORT, work / fmt, prefix, *common)):
        prompt = prose_prompt(url)
        stored(url, prompt)
        out["ram"], _ = hit_ttft(url, prompt)
        written = cache_stats(url)
    tokens = written["blocks_saved"] * 128
    out["bytes_per_token"] = written["encoded_blob_bytes"] / tokens
    out["kv_bytes_per_token"] = written["encoded_bytes"] / tokens
    out["encode_gbps"] = written["encoded_bytes"] / written["encode_us"] / 1e3
    with running(serve(PORT, work / fmt, prefix, *common, "--ram-cache-bytes", "0")):
        out["file"], out["cached"] = hit_ttft(url, prompt)
        read = cache_stats(url)
    out["decode_gbps"] = read["decoded_bytes"] / read["decode_us"] / 1e3
    s3 = ("--blob-url", f"{s3_url}/{fmt}", "--max-cache-bytes", "10GB", "--ram-cache-bytes", "0")
    with running(serve(PORT, work / fmt, prefix + "s3:", *common, *s3)):
        stored(url, prompt)
        out["s3"], _ = hit_ttft(url, prompt)
    disk = ("--blob-disk-cache", str(work / f"{fmt}-disk"))
    with running(serve(PORT, work / fmt, prefix + "s3:", *common, *s3, *disk)):
        timed_first_token(url, prompt)  # NOTE: the first hit reads the bucket and fills the disk tier
        out["s3_disk"], _ = hit_ttft(url, prompt)
    return out


def promise(work: Path, fmt: str, cold_url: str, prompts: list[str]) -> SweepResult:
    """The sweep: the cached server in ``fmt`` against the ``--no-cache`` one."""
    prefix = f"kvpfmt-{uuid.uuid4().hex[:8]}:"
    with running(serve(PORT, work / f"{fmt}-sweep", prefix, "--block-format", fmt)):
        return sweep(f"http://127.0.0.1:{PORT}", cold_url, MODEL, prompts)


MARKERS = ("<!-- formats: bench.formats -->", "<!-- /formats -->")


def section(results: dict[str, dict[str, Any]], sweeps: dict[str, SweepResult]) -> list[str]:
    rows = []
    for fmt, r in results.items():
        s, ms = sweeps[fmt], {k: f"{r[k] * 1e3:.0f} ms" for k in ("ram", "file", "s3", "s3_disk")}
        ratio = r["kv_bytes_per_token"] / r["bytes_per_token"]
        rows.append(
            f"| `{fmt}` | {r['bytes_per_token'] / 1024:.1f} KiB ({ratio:.2f} x smaller) "
            f"| {r['encode_gbps']:.2f} | {r['decode_gbps']:.2f} | {ms['ram']} "
            f"| {ms['file']} ({r['file'] / r['ram']:.2f} x) | {ms['s3']} | {ms['s3_disk']} "
            f"| {s.identical} of {s.prompts} | {s.max_first_logprob_diff:.1e} |"
        )
    return [
        MARKERS[0],
        f"## Block formats (`--block-format`; {time.strftime('%Y-%m-%d')}, `python -m bench.formats`)",
        "",
        "2,048 tokens of prose on the default model (float32 K/V: 45 KiB per token in memory), 16 blocks,",
        "medians of 7 full hits (2,047 tokens cached). Bytes per token are the blobs' (and how many",
        "times smaller than the K/V). The codec's GB/s count K/V bytes as the servers timed them",
        "(`/v1/cache/stats`: the writer thread encoding, one Blosc2 thread; a lookup decoding and",
        "verifying, two). RAM tier: blocks in process memory. File: a new process with",
        "`--ram-cache-bytes 0` reads, verifies and decodes every blob (from the page cache). S3: the",
        "same from moto's local server, then with `--blob-disk-cache` after its first hit. The sweep:",
        "50 prompts on a shared 384-token prefix, 64 greedy tokens, against a `--no-cache` server:",
        "answers identical, and the largest difference of first-token log-probabilities.",
        "",
        "| Format | Bytes per token | Encode GB/s | Decode GB/s | Hit TTFT, RAM tier | Hit TTFT, file "
        "blobs | Hit TTFT, S3 | Hit TTFT, S3 + disk tier | Sweep: identical | Sweep: max logprob Δ |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Target: a hit from file blobs within 1.3 x of a RAM-tier hit: "
        + ", ".join(f"`{f}` {r['file'] / r['ram']:.2f} x" for f, r in results.items())
        + (" (met)." if all(r["file"] <= 1.3 * r["ram"] for r in results.values()) else " (not met)."),
        "Decoding 16 blobs (94 MB of K/V for `exact`) is what a RAM-tier hit does not do; on 2 cores it",
        "takes about as long as that whole hit.",
        MARKERS[1],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--formats", default=",".join(FORMATS_MEASURED))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-formats-"))
    s3 = LocalS3().start()
    try:
        use_s3(s3.url, "kvpformats")
        formats = args.formats.split(",")
        results = {fmt: measure(work, fmt, "s3://kvpformats") for fmt in formats}
    finally:
        s3.stop()
    prompts = sweep_prompts()
    with running(serve(COLD_PORT, work / "cold", f"kvpfmt-cold-{uuid.uuid4().hex[:8]}:", "--no-cache")):
        sweeps = {fmt: promise(work, fmt, f"http://127.0.0.1:{COLD_PORT}", prompts) for fmt in formats}
    lines = section(results, sweeps)
    splice(Path(args.out), lines, MARKERS)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
