"""What a grammar costs the decode step: decode tok/s of the default model with and without a
JSON-schema grammar (``response_format`` json_schema, ``engine.constraint``), one stream and four
at once, on one ``kvproxy serve`` (``--no-cache``: decode alone). Writes its section of
``docs/benchmarks.md`` between ``MARKERS``.

    python -m bench.grammar
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.engine_targets import KVPROXY_PORT, MODEL
from bench.report import splice
from bench.servers import running, serve

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<!-- grammar: bench.grammar -->", "<!-- /grammar -->")
LIBRARY = "llguidance"
MAX_TOKENS = 128
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "steps": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "steps"],
    "additionalProperties": False,
}
PROMPT = "List every step of baking bread, in great detail, as JSON with a title and steps."


def decode_rate(url: str, constrained: bool, seed: int) -> tuple[int, float]:
    """One streamed request: (tokens after the first, seconds from the first to the last)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.7,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "recipe", "schema": SCHEMA}}
    first = last = 0.0
    tokens = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    return max(0, tokens - 1), last - first


def measure(url: str, constrained: bool, concurrency: int, rounds: int = 3) -> float:
    """Decode tok/s, summed over ``concurrency`` streams at once (median of ``rounds``)."""
    rates = []
    with ThreadPoolExecutor(concurrency) as pool:
        for r in range(rounds):
            seeds = [r * concurrency + i for i in range(concurrency)]
            runs = list(pool.map(lambda s: decode_rate(url, constrained, s), seeds))
            rates.append(sum(t for t, _ in runs) / max(s for _, s in runs))
    return statistics.median(rates)


def section(rates: dict[tuple[bool, int], float]) -> list[str]:
    rows = [
        f"| {n} | {rates[False, n]:.1f} | {rates[True, n]:.1f} | {rates[True, n] / rates[False, n]:.2f} |"
        for n in (1, 4)
    ]
    return [
        MARKERS[0],
        f"## Grammar-constrained decoding ({time.strftime('%Y-%m-%d')}, bench.grammar)",
        "",
        f"Decode tok/s of {MODEL} (`--no-cache`), {MAX_TOKENS}-token streamed chat answers, with and",
        f"without a `response_format` JSON schema enforced by {LIBRARY} (the mask of each constrained",
        "row is computed on the model thread before it is sampled; unconstrained rows are untouched).",
        "Summed over the streams running at once; median of 3 rounds.",
        "",
        "| streams | free text tok/s | JSON schema tok/s | ratio |",
        "| --- | --- | --- | --- |",
        *rows,
        MARKERS[1],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-grammar-"))
    prefix = f"kvpgrammar-{random.getrandbits(32):08x}:"
    url = f"http://127.0.0.1:{KVPROXY_PORT}"
    with running(serve(KVPROXY_PORT, work, prefix, "--no-cache")):
        decode_rate(url, True, 0)  # NOTE: the first grammar builds llguidance's tokenizer (once)
        rates = {(c, n): measure(url, c, n) for n in (1, 4) for c in (False, True)}
    lines = section(rates)
    splice(Path(args.out), lines, MARKERS)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
