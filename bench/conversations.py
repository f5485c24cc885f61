"""The conversation workload alone, side by side: kvproxy, kvproxy ``--no-tails`` and
llama-cpp-python's server (``bench.engine_load.conversations``: 6 conversations x 3 turns,
~1,500-token system prompts, round-robin, 24-token replies), one server at a time on this
machine. Writes its section of ``docs/benchmarks.md`` between ``MARKERS`` (the rest of the file
is the full run's, ``bench.side_by_side``, which measures the same workload among the rest).

    python -m bench.conversations --llama-python VENV/bin/python --gguf SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.client import Client
from bench.engine_load import conversations
from bench.engine_targets import KVPROXY_PORT, LLAMA_PORT, MODEL, stored_per_request
from bench.report import splice
from bench.report_engine import header, row, tails_table
from bench.servers import running, serve, serve_llama_cpp

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<!-- conversations: bench.conversations -->", "<!-- /conversations -->")


def measure(work: Path, prefix: str, llama: tuple[str, Path]) -> dict[str, Any]:
    """The workload on each server, and what the kvproxy ones stored per request."""
    url = f"http://127.0.0.1:{KVPROXY_PORT}"
    out: dict[str, Any] = {"talks": {}, "stored": {}}
    for label, flags in (("kvproxy", ()), ("kvproxy --no-tails", ("--no-tails",))):
        with running(
            serve(KVPROXY_PORT, work / label.replace(" ", ""), f"{prefix}{len(out['talks'])}:", *flags)
        ):
            out["talks"][label] = talks = conversations(Client(f"{url}/v1"), MODEL)
            out["stored"][label] = stored_per_request(url, talks.requests)
    with running(serve_llama_cpp(LLAMA_PORT, *llama)):
        client = Client(f"http://127.0.0.1:{LLAMA_PORT}/v1", require_usage=False)
        out["talks"]["llama.cpp"] = conversations(client, "smollm2")
    return out


def section(out: dict[str, Any]) -> list[str]:
    """The targets and the tables of one run."""
    ours, blocks, peer = (out["talks"][k] for k in ("kvproxy", "kvproxy --no-tails", "llama.cpp"))
    mine, theirs = ours.later_turns_p50_s, peer.later_turns_p50_s
    computed, new = ours.later_uncached_mean, ours.later_new_mean
    rows = [
        (
            "turns 2-3 TTFT p50: kvproxy >= 5 x better than llama.cpp",
            f"{mine:.3f} s vs {theirs:.3f} s = {theirs / mine:.1f} x",
            theirs >= 5 * mine,
        ),
        (
            "turns 2-3: mean uncached tokens <= the new message's tokens + the template's markers",
            f"{computed:.1f} uncached vs {new:.1f} new (a request's prompt - the previous prompt and answer)",
            computed <= new,
        ),
    ]
    runs = {"kvproxy": ours, "kvproxy --no-tails": blocks, "llama.cpp": peer}
    return [
        MARKERS[0],
        f"## Conversations, reused to the token ({time.strftime('%Y-%m-%d')}, bench.conversations)",
        "",
        "6 conversations x 3 turns, ~1,500-token system prompts, asked round-robin (every turn 1, then",
        "every turn 2, ...), 24-token greedy replies, streamed; one server at a time on this machine.",
        "",
        "| Target | Measured | Met |",
        "| --- | --- | --- |",
        *[f"| {name} | {measured} | {'yes' if met else 'no'} |" for name, measured, met in rows],
        "",
        *header(runs),
        row("TTFT, turn 1 (cold), p50", (f"{t.first_turn_p50_s:.2f} s" for t in runs.values())),
        row("TTFT, turns 2-3, p50", (f"{t.later_turns_p50_s:.3f} s" for t in runs.values())),
        row("wall time", (f"{t.wall_s:.1f} s" for t in runs.values())),
        "",
        *tails_table(
            {"peers": {"kvproxy": {"conversations": ours}}, "blocks_only": blocks, "stored": out["stored"]}
        ),
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
    work = Path(tempfile.mkdtemp(prefix="kvproxy-conversations-"))
    prefix = f"kvpconv-{random.getrandbits(32):08x}:"
    lines = section(measure(work, prefix, (args.llama_python, Path(args.gguf))))
    splice(Path(args.out), lines, MARKERS)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
