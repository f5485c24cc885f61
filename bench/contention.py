"""A busy host, side by side: kvproxy and llama-cpp-python's server (same GGUF, 2 threads), each
measured quiet and beside a CPU hog pinned to one core, one server at a time: single-stream decode
(``bench.engine_load.decode_speed``) and the multi-turn conversations (``conversations``: 6 x 3
turns, ~1,500-token system prompts). The target is that contention costs kvproxy no more than it
costs llama.cpp, relative to each one's quiet speed, and leaves kvproxy's decode at least half of
its quiet rate. Writes its section of ``docs/benchmarks.md`` between ``MARKERS``.

    python -m bench.contention --llama-python VENV/bin/python --gguf SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.client import Client
from bench.engine_load import Conversations, conversations, decode_speed, hog
from bench.engine_targets import EOS, KVPROXY_PORT, LLAMA_PORT, MODEL
from bench.report import splice
from bench.report_engine import header, row
from bench.servers import running, serve, serve_llama_cpp

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<!-- contention: bench.contention -->", "<!-- /contention -->")


ROUNDS = 5
"""Quiet and busy decode measurements alternate this many times (the median of each is kept): the
machine's speed drifts by tens of percent from minute to minute, alike for both."""


def measure_one(client: Client, model: str) -> dict[str, Any]:
    """Decode speed quiet and beside the hog, alternating; then the conversations quiet and busy
    (fresh ones: other system prompts, so the busy run reuses nothing of the quiet one)."""
    decode_speed(client, model, tokens=32, repeats=1, ban=EOS)  # NOTE: a warm-up, not counted
    rates: dict[str, list[float]] = {"quiet": [], "busy": []}
    for _ in range(ROUNDS):
        rates["quiet"].append(decode_speed(client, model, repeats=1, ban=EOS))
        with hog():
            rates["busy"].append(decode_speed(client, model, repeats=1, ban=EOS))
    out: dict[str, Any] = {label: {"decode": statistics.median(r)} for label, r in rates.items()}
    out["quiet"]["talks"] = conversations(client, model, seed=0)
    with hog():
        out["busy"]["talks"] = conversations(client, model, seed=1)
    return out


def measure(work: Path, prefix: str, llama: tuple[str, Path]) -> dict[str, Any]:
    """Each server's measurements (kvproxy in its default settings)."""
    out: dict[str, Any] = {}
    with running(serve(KVPROXY_PORT, work / "blobs", prefix)):
        out["kvproxy"] = measure_one(Client(f"http://127.0.0.1:{KVPROXY_PORT}/v1"), MODEL)
    with running(serve_llama_cpp(LLAMA_PORT, *llama)):
        out["llama.cpp"] = measure_one(
            Client(f"http://127.0.0.1:{LLAMA_PORT}/v1", require_usage=False), "smollm2"
        )
    return out


def section(out: dict[str, Any]) -> list[str]:
    """The targets and the table of one run."""

    def kept(server: str, what: str) -> float:  # busy over quiet: the share of its speed kept
        quiet, busy = out[server]["quiet"], out[server]["busy"]
        if what == "decode":
            return float(busy["decode"] / quiet["decode"])
        talks: tuple[Conversations, Conversations] = (quiet["talks"], busy["talks"])
        return talks[0].later_turns_p50_s / talks[1].later_turns_p50_s

    ours, theirs = kept("kvproxy", "decode"), kept("llama.cpp", "decode")
    ours_ttft, theirs_ttft = kept("kvproxy", "ttft"), kept("llama.cpp", "ttft")
    targets = [
        ("kvproxy's decode beside a busy core >= 0.5 x its quiet rate", f"{ours:.2f} x", ours >= 0.5),
        (
            "kvproxy keeps at least llama.cpp's share of its quiet decode rate",
            f"{ours:.2f} x vs {theirs:.2f} x",
            ours >= theirs,
        ),
        (
            "kvproxy keeps at least llama.cpp's share of its quiet turns 2-3 TTFT",
            f"{ours_ttft:.2f} x vs {theirs_ttft:.2f} x",
            ours_ttft >= theirs_ttft,
        ),
    ]
    cells: dict[str, list[str]] = {}
    for runs in out.values():
        quiet, busy = runs["quiet"], runs["busy"]
        for label, fn in (
            ("decode, one stream", lambda r: f"{r['decode']:.1f} tok/s"),
            ("TTFT, turn 1 (cold), p50", lambda r: f"{r['talks'].first_turn_p50_s:.2f} s"),
            ("TTFT, turns 2-3, p50", lambda r: f"{r['talks'].later_turns_p50_s:.3f} s"),
            ("conversations' wall time", lambda r: f"{r['talks'].wall_s:.1f} s"),
        ):
            cells.setdefault(label, []).extend([fn(quiet), fn(busy)])
    columns = [f"{server} {when}" for server in out for when in ("quiet", "busy core")]
    return [
        MARKERS[0],
        f"## A busy host ({time.strftime('%Y-%m-%d')}, bench.contention)",
        "",
        "Each server alone on this machine, quiet, then beside a process spinning on one of its two",
        "cores (pinned there); kvproxy in its default settings, llama-cpp-python's server with",
        "`--n_threads 2` and its RAM prompt cache. Decode: one stream, 128 tokens, the median of",
        f"{ROUNDS} runs, quiet and busy runs alternating.",
        "Conversations: 6 x 3 turns, ~1,500-token system prompts, 24-token replies, other prompts",
        "for the busy run than for the quiet one.",
        "",
        "| Target | Measured | Met |",
        "| --- | --- | --- |",
        *[f"| {name} | {measured} | {'yes' if met else 'no'} |" for name, measured, met in targets],
        "",
        *header(columns),
        *[row(label, values) for label, values in cells.items()],
        MARKERS[1],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--llama-python", required=True, help="python of a virtualenv with llama-cpp-python[server]"
    )
    parser.add_argument("--gguf", required=True, help="the GGUF file llama.cpp serves")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-contention-"))
    prefix = f"kvpbusy-{random.getrandbits(32):08x}:"
    lines = section(measure(work, prefix, (args.llama_python, Path(args.gguf))))
    splice(Path(args.out), lines, MARKERS)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
