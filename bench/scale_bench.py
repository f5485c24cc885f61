"""Scale-out topologies, measured: a hit's lookup on one Redis against a 3-master Redis Cluster
(latency and commands per request), and the hit TTFT of a 2,048-token prompt with blocks read from a
directory or from S3 (RAM tier off), written into ``docs/benchmarks.md``.

    python -m bench.scale_bench

Starts its own servers on free ports (``tests.topologies``: a local cluster and moto's S3
server), plus ``kvproxy serve`` on the default model for each topology.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import redis

from bench.cache_targets import timed_first_token
from bench.report import SCALE, splice
from bench.servers import running, serve, use_s3
from tests.topologies import LocalCluster, LocalS3

ROOT = Path(__file__).resolve().parents[1]
PORT = 8640


def commands(ports: list[int]) -> dict[str, int]:
    """Calls per command (``INFO commandstats``) summed over the Redis servers on ``ports``."""
    out: dict[str, int] = {}
    for port in ports:
        for name, stats in redis.Redis(port=port).info("commandstats").items():
            out[name] = out.get(name, 0) + stats["calls"]
    return out


def measure(work: Path, label: str, prompt: list[int], ports: list[int], *flags: str) -> dict[str, float]:
    """Cold TTFT of ``prompt``, then over 7 hits: median TTFT, median lookup stage (the server's
    ``load_seconds``), and per hit the scripts (lookups) and all commands the Redis servers on
    ``ports`` served."""
    prefix = f"kvpscale-{uuid.uuid4().hex[:8]}:"
    with running(serve(PORT, work / label, prefix, *flags)):
        url = f"http://127.0.0.1:{PORT}"
        cold, _ = timed_first_token(url, prompt)
        time.sleep(3)  # the writer stores the blocks
        timed_first_token(url, prompt)
        time.sleep(1)
        before = commands(ports)
        hits = [timed_first_token(url, prompt) for _ in range(7)]
        time.sleep(1)  # the counters of the last hit
        after = commands(ports)
    served = {k: after[k] - before.get(k, 0) for k in after}
    return {
        "cold": cold,
        "hit": statistics.median(t for t, _ in hits),
        "load": statistics.median(e["load_seconds"] for _, e in hits),
        "cached": hits[-1][1].get("cached_tokens", 0),
        "scripts": (served.get("cmdstat_evalsha", 0) + served.get("cmdstat_eval", 0)) / len(hits),
        "commands": (sum(served.values()) - len(ports)) / len(hits),  # NOTE: minus the INFO itself
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-scale-"))
    prompt = [random.Random(0).randrange(100, 40000) for _ in range(2048)]
    cluster, s3 = LocalCluster().start(), LocalS3().start()
    try:
        one = [urlsplit(args.redis_url).port or 6379]
        lookups = {
            "one Redis": measure(work, "l1", prompt, one, "--redis-url", args.redis_url),
            "Redis Cluster (3 masters)": measure(
                work, "lc", prompt, cluster.ports, "--redis-url", cluster.url
            ),
        }
        use_s3(s3.url, "kvpscale")
        off = ("--ram-cache-bytes", "0")
        hits = {
            "one Redis, file blobs": measure(work, "f", prompt, one, *off, "--redis-url", args.redis_url),
            "Redis Cluster, file blobs": measure(
                work, "c", prompt, cluster.ports, *off, "--redis-url", cluster.url
            ),
            "one Redis, S3 blobs (moto, local)": measure(
                work,
                "s3",
                prompt,
                one,
                *off,
                "--redis-url",
                args.redis_url,
                "--blob-url",
                "s3://kvpscale/blocks",
                "--max-cache-bytes",
                "10GB",
            ),
        }
    finally:
        cluster.stop()
        s3.stop()
    section = [
        SCALE[0],
        "## Scaling out (`python -m bench.scale_bench`)",
        "",
        "A full hit on a 2,048-token prompt (16 blocks in the RAM tier, default model, medians of 7):",
        "the lookup stage is the server's own timing of the index round trip; the Redis columns count",
        "what the Redis servers served per request (the lookup's script, and every command: the",
        "lookup plus the deployment-wide counters).",
        "",
        "| Index | Lookup stage | Hit TTFT | Lookup scripts per request | Redis commands per request |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {k} | {v['load'] * 1e3:.1f} ms | {v['hit'] * 1e3:.0f} ms | {v['scripts']:.1f} "
            f"| {v['commands']:.1f} |"
            for k, v in lookups.items()
        ],
        "",
        "A 2,048-token prompt on the default model, RAM tier off (`--ram-cache-bytes 0`), so a hit",
        "reads its 16 blobs from the blob store (medians of 7 hits):",
        "",
        "| Topology | Cold TTFT | Hit TTFT | Lookup stage of a hit | Cached tokens |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {k} | {v['cold']:.2f} s | {v['hit'] * 1e3:.0f} ms | {v['load'] * 1e3:.0f} ms "
            f"| {v['cached']} |"
            for k, v in hits.items()
        ],
        SCALE[1],
    ]
    splice(Path(args.out), section, SCALE)
    print("\n".join(section))


if __name__ == "__main__":
    main()
