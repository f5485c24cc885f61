"""The engine's part of ``docs/benchmarks.md``: kvproxy against llama.cpp, the formats, concurrency
and the promise sweep (measurements of ``bench.engine_targets``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bench.promise import NEAR_TIE, SweepResult

Target = tuple[str, str, bool]


TODAY_COLD_TTFT_S = 3.88
"""The cold TTFT of the formats table's 1,500-token chat before the source format (float32/full,
docs/benchmarks.md of the previous engine): the cold prefill must not get slower."""


def engine_targets(engine: dict[str, Any]) -> list[Target]:
    """Decode >= 1.5x llama.cpp, 4 streams >= 2x, turns 2-3 TTFT >= 5x better and computing no
    more than their new messages and markers, the server's decode within 20% of its step's, cold
    prefill no slower than before, Paris, and the promise in each format swept."""
    peers, out = engine["peers"], []
    llama = peers.get("llama.cpp")
    if llama is not None:
        ours, theirs = engine["decode_alternating"]["kvproxy"], engine["decode_alternating"]["llama.cpp"]
        out.append(
            (
                "decode, one stream: kvproxy (default) >= 1.5 x llama.cpp",
                f"{ours:.1f} vs {theirs:.1f} tok/s = {ours / theirs:.2f} x (alternating, median of 3)",
                ours >= 1.5 * theirs,
            )
        )
        mine4, peer4 = engine["concurrency"]["kvproxy"][4], engine["concurrency"]["llama.cpp"][4]
        out.append(
            (
                "decode, 4 concurrent streams, aggregate: kvproxy >= 2 x llama.cpp",
                f"{mine4:.1f} vs {peer4:.1f} tok/s = {mine4 / peer4:.2f} x",
                mine4 >= 2 * peer4,
            )
        )
        mine, peer = (
            peers["kvproxy"]["conversations"].later_turns_p50_s,
            llama["conversations"].later_turns_p50_s,
        )
        out.append(
            (
                "conversations, turns 2-3 TTFT p50: kvproxy >= 5 x better than llama.cpp",
                f"{mine:.3f} s vs {peer:.3f} s = {peer / mine:.1f} x",
                peer >= 5 * mine,
            )
        )
    talks = peers["kvproxy"]["conversations"]
    computed, new = talks.later_uncached_mean, talks.later_new_mean
    out.append(
        (
            "conversations, turns 2-3: mean uncached tokens <= the new message's tokens + the markers",
            f"{computed:.1f} uncached vs {new:.1f} new (a request's prompt - the previous prompt and answer)",
            computed <= new,
        )
    )
    step, served = engine["step_tok_s"], peers["kvproxy"]["decode"]
    out.append(
        (
            "decode, one stream: the server's tok/s within 20% of its own decode step's rate",
            f"{served:.1f} vs {step:.1f} tok/s (the step's forward passes alone) = {served / step:.2f} x",
            served >= 0.8 * step,
        )
    )
    formats = engine["formats"]
    cold, full = formats["float32/source"]["cold_ttft_s"], formats["float32/full"]["cold_ttft_s"]
    out.append(
        (
            "cold prefill, 1,500-token system prompt: default format no slower than before",
            f"{cold:.2f} s (before: {TODAY_COLD_TTFT_S:.2f} s; float32/full in this run {full:.2f} s)",
            cold <= TODAY_COLD_TTFT_S,
        )
    )
    paris = engine["paris"]
    out.append(("'What is the capital of France?' (default format)", repr(paris), "Paris" in paris))
    for label, result in engine["sweep"].items():
        near = [d for d in result.divergences if d.near_tie]
        out.append(
            (
                f"cached == cold, 50 prompts on a 384-token prefix, 64 tokens ({label})",
                f"{result.identical}/{result.prompts} identical, {len(near)} divergences at a near-tie "
                f"(gap < {NEAR_TIE}), {len(result.divergences) - len(near)} elsewhere; first-token "
                f"log-probabilities within {result.max_first_logprob_diff:.1e}",
                result.identical == result.prompts,
            )
        )
    return out


def engine_tables(engine: dict[str, Any]) -> list[str]:
    """The side-by-side table, the formats, concurrency and the sweep's divergences."""
    peers = engine["peers"]
    lines = [
        "## kvproxy against llama.cpp (SmolLM2-135M-Instruct, streaming chat, temperature 0)",
        "",
        "| | " + " | ".join(peers) + " |",
        "| --- |" + " --- |" * len(peers),
        "| format | " + " | ".join(p["format"] for p in peers.values()) + " |",
        "| 6 conversations x 3 turns, ~1,500-token system prompts, round-robin, 24-token replies: "
        "wall time | " + " | ".join(f"{p['conversations'].wall_s:.1f} s" for p in peers.values()) + " |",
        "| TTFT, turn 1 (cold), p50 | "
        + " | ".join(f"{p['conversations'].first_turn_p50_s:.2f} s" for p in peers.values())
        + " |",
        "| TTFT, turns 2-3, p50 | "
        + " | ".join(f"{p['conversations'].later_turns_p50_s:.2f} s" for p in peers.values())
        + " |",
        "| decode, one stream, 128 tokens | "
        + " | ".join(f"{p['decode']:.1f} tok/s" for p in peers.values())
        + " |",
        "",
    ]
    lines += tails_table(engine)
    if "decode_alternating" in engine:
        alternating = engine["decode_alternating"]
        lines += [
            "Decode measured again with both servers up, alternating request by request (3 rounds, medians): "
            + ", ".join(f"{k} {v:.1f} tok/s" for k, v in alternating.items())
            + ".",
            "",
        ]
    lines += [
        "## Formats (`--dtype`, `--weights`; cold and hit: a chat with a 1,500-token system prompt)",
        "",
        "| --dtype/--weights | what runs | decode tok/s (1 stream) | cold TTFT s | hit TTFT s "
        "| cached tokens |",
        "| --- | --- | --- | --- | --- | --- |",
        *[
            f"| {name} | {row['format']} | {row['decode']:.1f} | {row['cold_ttft_s']:.2f} "
            f"| {row['hit_ttft_s']:.3f} | {row['hit_cached_tokens']} |"
            for name, row in engine["formats"].items()
        ],
        "",
        "## Concurrent streams (default format, `--max-batch 8`, 64 tokens each; aggregate decode tok/s)",
        "",
        "| Streams | " + " | ".join(engine["concurrency"]) + " |",
        "| --- |" + " --- |" * len(engine["concurrency"]),
        *[
            f"| {n} | " + " | ".join(f"{rates[n]:.1f}" for rates in engine["concurrency"].values()) + " |"
            for n in (1, 4, 8)
        ],
        "",
        "## Decode threads (`--decode-threads`; one stream, 128 tokens, default format)",
        "",
        "| Threads | quiet machine tok/s | beside a busy core tok/s |",
        "| --- | --- | --- |",
        *[f"| {n} | {r['quiet']:.1f} | {r['busy']:.1f} |" for n, r in engine["threads"].items()],
        "",
        "## The promise (`bench.promise`)",
        "",
    ]
    for label, result in engine["sweep"].items():
        lines += sweep_lines(label, result)
    lines += [
        "## The default format against the float32 checkpoint",
        "",
        "The same 50 sweep prompts and 20 chat prompts (64 greedy tokens, both `--no-cache`): the",
        "default format (the GGUF's codes, native step) against `--weights full` (the float32",
        "checkpoint those codes de-quantize to, the same weights summed in another order). At each",
        "divergence, the full format's top-2 log-probability gap.",
        "",
        *sweep_lines("source against full", engine["against_full"]),
    ]
    return lines


def tails_table(engine: dict[str, Any]) -> list[str]:
    """What tails store, and the hit rate, uncached tokens and TTFT they buy (the conversation
    workload on the default server against ``--no-tails``)."""
    runs = {
        "kvproxy": engine["peers"]["kvproxy"]["conversations"],
        "kvproxy --no-tails": engine["blocks_only"],
    }
    stored = [engine["stored"][k] for k in runs]
    talks = runs.values()
    return [
        f"### Tails: what they store and buy (the conversations, {runs['kvproxy'].requests} requests each)",
        "",
        *header(runs),
        row("hit rate (cached / prompt tokens, every turn)", (f"{t.hit_rate:.1%}" for t in talks)),
        row("turns 2-3: mean uncached tokens per request", (f"{t.later_uncached_mean:.1f}" for t in talks)),
        row(
            "turns 2-3: mean new tokens per request (message + markers)",
            (f"{t.later_new_mean:.1f}" for t in talks),
        ),
        row("TTFT, turns 2-3, p50", (f"{t.later_turns_p50_s:.3f} s" for t in talks)),
        row("stored per request: tails", (f"{s['tails']:.1f}" for s in stored)),
        row("stored per request: tail bytes", (f"{s['tail_bytes'] / 1e6:.1f} MB" for s in stored)),
        row("stored per request: block bytes", (f"{s['block_bytes'] / 1e6:.1f} MB" for s in stored)),
        "",
    ]


def header(columns: Iterable[str]) -> list[str]:
    """A markdown table's head: an empty corner, then ``columns``."""
    names = list(columns)
    return ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]


def row(label: str, cells: Iterable[str]) -> str:
    """One markdown table row."""
    return f"| {label} | " + " | ".join(cells) + " |"


def sweep_lines(label: str, result: SweepResult) -> list[str]:
    """One format's sweep: the summary and every divergence with the cold top-2 gap at its step."""
    cached = sorted(set(result.cached_tokens))
    lines = [
        f"- **{label}**: {result.identical} of {result.prompts} answers identical; cached tokens per prompt "
        f"{cached}; max |Δ| of first-token log-probabilities {result.max_first_logprob_diff:.1e}.",
    ]
    for d in result.divergences:
        verdict = "near-tie" if d.near_tie else "NOT a near-tie"
        lines.append(
            f"  - prompt {d.prompt}: first differs at step {d.step}, cold top-2 gap {d.gap:.4f} ({verdict})"
        )
    return [*lines, ""]
