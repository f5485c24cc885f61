"""Speculation side by side: single-stream decode speed on prose and on copy-heavy work, kvproxy
(drafting, and ``--no-speculation``) against llama-cpp-python's server on the same GGUF without
drafts and with its own prompt-lookup drafts (``--draft_model prompt-lookup-decoding``).

Workloads (``bench.workloads.copy_heavy``; greedy, streamed, answers of up to ``MAX_TOKENS`` tokens):

- ``prose``: stories and explanations, nothing to copy;
- ``rag-quote``: a document, and an answer that quotes it;
- ``code-edit``: a Python module rewritten whole with one name changed;
- ``tool-args``: a JSON tool call whose argument echoes a long text from the prompt;
- ``agent-echo``: a command's output (a directory listing), shown again by the answer.

Each server runs every prompt once to put its prompt in its cache (one token), then once measured:
decode rate = (tokens - 1) / (last token - first token), tokens from the server's usage or, for
llama.cpp's streams (which carry none), its content chunks. Rounds alternate the servers.
kvproxy's drafted and accepted tokens per workload come from its ``/stats``; its answers with and
without speculation are compared (they must be equal), and llama.cpp's with and without its drafts.
The section "Speculation" of ``docs/benchmarks.md`` is written from the run.

    python -m bench.speculation --llama-python VENV/bin/python --gguf PATH/source.gguf
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.client import Client
from bench.engine_load import concurrent_speed
from bench.report import splice
from bench.report_engine import header, row
from bench.servers import running, serve, serve_llama_cpp
from bench.workloads import Messages, copy_heavy

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 256
KVPROXY_PORT, LLAMA_PORT = 8631, 8632


def measure(client: Client, model: str, prompts: dict[str, list[str | Messages]]) -> dict[str, Any]:
    """Per workload: each prompt's decode rate (tokens/s), tokens and answer text."""
    out: dict[str, Any] = {}
    for name, requests in prompts.items():
        rows = []
        for prompt in requests:
            send = client.complete if isinstance(prompt, str) else client.chat
            send(model, prompt, 1)  # type: ignore[arg-type]  # the prompt into the server's cache
            result, answer = send(model, prompt, MAX_TOKENS)  # type: ignore[arg-type]
            rate, tokens = result.decode_tokens_per_s, result.completion_tokens
            rows.append({"tok_s": rate, "tokens": tokens, "text": answer})
        out[name] = rows
    return out


def drafts(url: str) -> tuple[int, int]:
    """The server's drafted and accepted tokens so far (its ``/stats``)."""
    process = httpx.get(f"{url}/stats", timeout=30).json()["process"]
    return process["draft_tokens"], process["accepted_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--llama-python", default=None, help="python of a virtualenv with llama-cpp-python[server]"
    )
    parser.add_argument("--gguf", default=None, help="the GGUF file llama.cpp serves")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--streams", action="store_true", help="only aggregate speed at 1, 4 and 8 streams, on and off"
    )
    args = parser.parse_args()
    if args.streams:
        lines = streams(args.rounds)
        splice(Path(args.out), lines, STREAM_MARKERS)
        print("\n".join(lines))
        return
    prompts = copy_heavy()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-spec-"))
    prefix = f"kvpspec-{random.getrandbits(32):08x}:"
    kv_url = f"http://127.0.0.1:{KVPROXY_PORT}"
    servers: dict[str, tuple[Callable[[], Any], Client, str]] = {
        "kvproxy": (lambda: serve(KVPROXY_PORT, work / "on", prefix + "on:"), Client(f"{kv_url}/v1"), MODEL),
        "kvproxy --no-speculation": (
            lambda: serve(KVPROXY_PORT, work / "off", prefix + "off:", "--no-speculation"),
            Client(f"{kv_url}/v1"),
            MODEL,
        ),
    }
    if args.llama_python and args.gguf:
        llama = Client(f"http://127.0.0.1:{LLAMA_PORT}/v1", require_usage=False)
        gguf = Path(args.gguf)
        for peer, drafting in (("llama.cpp", False), ("llama.cpp prompt-lookup", True)):
            for threads in (2, 1):
                label = f"{peer}, {threads} thread{'s' if threads > 1 else ''}"
                launch = partial(serve_llama_cpp, LLAMA_PORT, args.llama_python, gguf, threads, drafting)
                servers[label] = (launch, llama, "smollm2")
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
    accepted: dict[str, list[int]] = {name: [0, 0] for name in prompts}
    for _ in range(args.rounds):
        for label, (start, client, model) in servers.items():
            with running(start()):
                if label != "kvproxy":
                    runs[label].append(measure(client, model, prompts))
                    continue
                result: dict[str, Any] = {}
                for name in prompts:
                    before = drafts(kv_url)
                    result |= measure(client, model, {name: prompts[name]})
                    after = drafts(kv_url)
                    accepted[name][0] += after[0] - before[0]
                    accepted[name][1] += after[1] - before[1]
                runs[label].append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"accepted": accepted, "runs": runs}, indent=1))
    lines = report(runs, accepted)
    splice(Path(args.out), lines, MARKERS)
    print("\n".join(lines))


MARKERS = ("<!-- bench.speculation -->", "<!-- /bench.speculation -->")
STREAM_MARKERS = ("<!-- bench.speculation --streams -->", "<!-- /bench.speculation --streams -->")


def streams(rounds: int) -> list[str]:
    """Aggregate decode speed of 1, 4 and 8 concurrent streams (``bench.engine_load``: 64-token
    answers to distinct short questions), kvproxy ``--max-batch 8`` with speculation and without,
    medians of ``rounds`` (servers alternating): the section of ``docs/benchmarks.md``."""
    work = Path(tempfile.mkdtemp(prefix="kvproxy-spec-streams-"))
    speeds: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for label, flags in (("kvproxy", ()), ("kvproxy --no-speculation", ("--no-speculation",))):
            key = f"kvpstreams-{random.getrandbits(32):08x}:"
            with running(serve(KVPROXY_PORT, work / key, key, "--max-batch", "8", *flags)):
                client = Client(f"http://127.0.0.1:{KVPROXY_PORT}/v1")
                for n in (1, 4, 8):
                    concurrent_speed(client, MODEL, n)  # NOTE: the prompts into the cache first
                    speeds.setdefault((label, n), []).append(concurrent_speed(client, MODEL, n))
    lines = [
        STREAM_MARKERS[0],
        f"### Speculation, concurrent streams ({time.strftime('%Y-%m-%d')}, bench.speculation --streams)",
        "",
        f"Aggregate tokens per second, medians of {rounds} rounds.",
        "",
        *header(["1 stream", "4 streams", "8 streams"]),
    ]
    for label in ("kvproxy", "kvproxy --no-speculation"):
        lines.append(row(label, [f"{statistics.median(speeds[(label, n)]):.1f}" for n in (1, 4, 8)]))
    return [*lines, STREAM_MARKERS[1]]


COPY_HEAVY = ("rag-quote", "code-edit", "tool-args", "agent-echo")


def same_answers(runs: dict[str, list[dict[str, Any]]], a: str, b: str) -> tuple[int, int]:
    """How many of the prompts ``a`` and ``b`` answered alike, of how many (every round)."""
    same = [
        x["text"] == y["text"]
        for run_a, run_b in zip(runs[a], runs[b], strict=True)
        for name in run_a
        for x, y in zip(run_a[name], run_b[name], strict=True)
    ]
    return sum(same), len(same)


def report(runs: dict[str, list[dict[str, Any]]], accepted: dict[str, list[int]]) -> list[str]:
    """The section of ``docs/benchmarks.md``: the targets, the median decode rate per workload and
    server, kvproxy's acceptance, and whose answers speculation changed."""
    rates = {
        label: {
            name: statistics.median(row["tok_s"] for run in rounds for row in run[name]) for name in rounds[0]
        }
        for label, rounds in runs.items()
    }
    ours = rates["kvproxy"]
    targets: list[tuple[str, float, float]] = []  # (target, measured ratio, goal)
    for peer, prose, copy in (("llama.cpp", 1.5, 2.5), ("llama.cpp prompt-lookup", 1.0, 1.5)):
        variants = [rates[label] for label in rates if label.startswith(f"{peer}, ")]
        if not variants:
            continue
        # NOTE: the peer at its best per kind: with 2 threads its server's rate on this machine
        # swings 30-100 tok/s from one request to the next, with 1 it holds about 58
        theirs = {name: max(v[name] for v in variants) for name in ours}
        targets.append((f"prose: kvproxy >= {prose} x {peer}", ours["prose"] / theirs["prose"], prose))
        worst = min(COPY_HEAVY, key=lambda n: ours[n] / theirs[n])
        targets.append(
            (
                f"copy-heavy, each kind: kvproxy >= {copy} x {peer} (worst: {worst})",
                ours[worst] / theirs[worst],
                copy,
            )
        )
    lines = [
        MARKERS[0],
        f"## Speculation ({time.strftime('%Y-%m-%d')}, bench.speculation)",
        "",
        "One stream, greedy, answers of up to 256 tokens, decode rate after the first token (medians",
        f"over {len(next(iter(runs.values())))} rounds x 3 prompts per kind); each server alone, rounds",
        "alternating. llama-cpp-python's server on the same GGUF, RAM prompt cache, `--n_threads` 2",
        "and 1, without drafts and with `--draft_model prompt-lookup-decoding` (10 tokens); targets",
        "against its faster thread count per kind. Copy-heavy",
        "prompts start the copy (see bench/speculation.py): a quoted document, code rewritten with a",
        "name changed, a JSON tool call echoing a text, a command's output repeated.",
        "",
        "| Target | Measured | Met |",
        "| --- | --- | --- |",
        *[
            f"| {name} | {ratio:.2f} x | {'yes' if ratio >= goal else 'no'} |"
            for name, ratio, goal in targets
        ],
        "",
        *header([*rates, "kvproxy: drafted tokens accepted"]),
    ]
    for name in ours:
        drafted, kept = accepted[name]
        share = f"{kept} of {drafted} ({kept / drafted:.0%})" if drafted else "none drafted"
        lines.append(row(name, [*(f"{rates[label][name]:.1f} tok/s" for label in rates), share]))
    lines.append("")
    pairs = [("kvproxy", "kvproxy --no-speculation")]
    pairs += [(f"llama.cpp prompt-lookup, {n}", f"llama.cpp, {n}") for n in ("2 threads", "1 thread")]
    for a, b in pairs:
        if a in runs and b in runs:
            same, total = same_answers(runs, a, b)
            lines.append(f"- Greedy answers of {a} equal to {b}'s: {same} of {total}.")
    return [*lines, MARKERS[1]]


if __name__ == "__main__":
    main()
