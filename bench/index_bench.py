"""The embedded index beside a Redis over TCP, in one run on one host: two ``kvproxy serve`` on the
default model, one on the default (embedded Valkey, unix socket) and one with ``--redis-url`` naming
a ``redis-server`` on a local port (append-only, as the embedded one). Each stores a 2,048-token
prompt; then the two are asked for it in turn (2,047 tokens cached, blocks in the RAM tier) and the
medians of TTFT and of the lookup stage (the index's script and the blocks' assembly) are kept,
and the median round trip of a PING to each index. Also the embedded
server's resident memory, idle after start and holding the run's index. Writes its section of
``docs/benchmarks.md`` between ``MARKERS``.

    python -m bench.index_bench [--redis-server redis-server] [--rounds 21]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from bench.cache_targets import timed_first_token
from bench.report import splice
from bench.servers import running, serve

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<!-- index: bench.index_bench -->", "<!-- /index -->")
EMBEDDED_PORT, TCP_PORT, REDIS_PORT = 8611, 8612, 8613


def rss_mb(pattern: str) -> float:
    """Resident memory (MB) of the one process whose command line matches ``pattern``."""
    (pid,) = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return int(subprocess.run(["ps", "-o", "rss=", "-p", pid], capture_output=True, text=True).stdout) / 1024


def round_trip(client: redis.Redis, times: int = 2000) -> float:
    """Median seconds of a PING answered (redis-py, one connection), of ``times``."""
    client.ping()
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        client.ping()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


@contextlib.contextmanager
def redis_server(binary: str, port: int, work: Path) -> Iterator[None]:
    """``binary`` on ``port`` (TCP, loopback), its append-only file in ``work`` synced each second."""
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", ""]
    args += ["--appendonly", "yes", "--appendfsync", "everysec"]
    proc = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(60)


def measure(rounds: int, binary: str) -> dict[str, float | str]:
    """Every number of the section (seconds and MB)."""
    work = Path(tempfile.mkdtemp(prefix="kvp-index-bench-"))
    models = Path(os.environ.get("KVPROXY_CACHE_DIR", Path.home() / ".cache" / "kvproxy")) / "models"
    (work / "cache").mkdir()
    (work / "cache" / "models").symlink_to(models)
    os.environ.pop("KVPROXY_REDIS_URL", None)
    os.environ["KVPROXY_CACHE_DIR"] = str(work / "cache")
    socket = work / "cache" / "index" / "valkey.sock"
    prompt = [random.Random(0).randrange(100, 40000) for _ in range(2048)]
    urls = {"embedded": f"http://127.0.0.1:{EMBEDDED_PORT}", "tcp": f"http://127.0.0.1:{TCP_PORT}"}
    tcp_flags = ("--redis-url", f"redis://127.0.0.1:{REDIS_PORT}/0")
    with (
        redis_server(binary, REDIS_PORT, work),
        running(serve(EMBEDDED_PORT, work / "blobs-embedded", "kvp:")),
        running(serve(TCP_PORT, work / "blobs-tcp", "kvp:", *tcp_flags)),
    ):
        idle = rss_mb(f"unixsocket.*{socket}")
        for url in urls.values():
            timed_first_token(url, prompt)  # NOTE: stores the 16 blocks and the tail
        time.sleep(3)
        seen: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
        for turn in range(rounds):
            for name, url in sorted(urls.items(), reverse=bool(turn % 2)):  # NOTE: each first in turn
                seconds, explain = timed_first_token(url, prompt)
                assert explain["cached_tokens"] == 2047, explain
                seen[name].append((seconds, explain["load_seconds"]))
        holding = rss_mb(f"unixsocket.*{socket}")
        trips = {
            "embedded": round_trip(redis.Redis(unix_socket_path=str(socket))),
            "tcp": round_trip(redis.Redis(port=REDIS_PORT)),
        }
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()[2][2:]
    out: dict[str, float | str] = {"idle_mb": idle, "holding_mb": holding, "redis": f"{binary} {version}"}
    for name, values in seen.items():
        out[f"{name}_ttft"] = statistics.median(s for s, _ in values)
        out[f"{name}_lookup"] = statistics.median(lookup for _, lookup in values)
        out[f"{name}_trip"] = trips[name]
    return out


def section(m: dict[str, float | str], rounds: int) -> list[str]:
    ms = {k: float(v) * 1000 for k, v in m.items() if k.endswith(("_ttft", "_lookup", "_trip"))}
    return [
        MARKERS[0],
        "## The embedded index beside a Redis over TCP (bench.index_bench)",
        "",
        f"A 2,048-token prompt, 2,047 tokens cached, blocks in the RAM tier (default model, token ids, "
        f"1 output token; medians of {rounds}, the two servers asked in turn). Both servers run on this "
        f"host; the TCP one's index is {m['redis']} on a loopback port, append-only like the embedded one.",
        "",
        "| Index | TTFT | lookup stage (the index's script, the RAM tier's blocks) | a PING's round trip |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {ms[name + '_ttft']:.1f} ms | {ms[name + '_lookup']:.2f} ms | "
            f"{ms[name + '_trip'] * 1000:.0f} µs |"
            for name, label in (
                ("embedded", "embedded Valkey, unix socket (the default)"),
                ("tcp", "`--redis-url redis://127.0.0.1:PORT`"),
            )
        ),
        "",
        f"The embedded server's resident memory: {float(m['idle_mb']):.1f} MB idle after start, "
        f"{float(m['holding_mb']):.1f} MB holding this run's index.",
        MARKERS[1],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-server", default="redis-server", help="the TCP Redis's binary")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    lines = section(measure(args.rounds, args.redis_server), args.rounds)
    print("\n".join(lines))
    splice(ROOT / "docs" / "benchmarks.md", lines, MARKERS)


if __name__ == "__main__":
    main()
