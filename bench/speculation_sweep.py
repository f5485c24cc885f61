"""The speculation promise, swept: greedy answers with speculation on equal those without it, on
prompts of several kinds (prose, code, JSON, tool calls, eight languages), through the chat API of
two ``kvproxy serve`` processes (one with ``--no-speculation``); the counts and, per kind, the
drafted tokens accepted, into the section "Speculation: the promise swept" of ``docs/benchmarks.md``.

    python -m bench.speculation_sweep            # 208 prompts, 128 tokens each
    python -m bench.speculation_sweep --per-kind 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.report import splice
from bench.servers import running, serve
from bench.speculation import drafts

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<!-- bench.speculation_sweep -->", "<!-- /bench.speculation_sweep -->")
MODEL = "smollm2-135m-instruct"
ON_PORT, OFF_PORT = 8641, 8642
SUBJECTS = (
    "a lighthouse", "the moon", "a bakery", "rain forests", "a chess game", "old trains", "bees",
    "a city at night", "volcanoes", "a library", "the ocean", "a robot", "winter", "a market",
    "mountains", "a violin", "the desert", "a garden", "bridges", "a comet",
)  # fmt: skip
LANGUAGES = {
    "French": "Écris un court paragraphe sur {}.",
    "German": "Schreibe einen kurzen Absatz über {}.",
    "Spanish": "Escribe un párrafo corto sobre {}.",
    "Italian": "Scrivi un breve paragrafo su {}.",
    "Portuguese": "Escreva um parágrafo curto sobre {}.",
    "Chinese": "请写一段关于{}的短文。",
    "Japanese": "{}についての短い文章を書いてください。",
    "Russian": "Напиши короткий абзац о {}.",  # noqa: RUF001 (Cyrillic, as written)
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_notes",
            "description": "Search the user's notes for a phrase.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
]


PROSE = ("Write a short story about {}.", "Describe {} to a curious child.", "Write a short poem about {}.")
JSON_ASKS = (
    "Return a JSON object about {}, with keys name, facts (a list) and score.",
    'Describe {} as JSON: {{"title": ..., "tags": [...], "rating": 1-5}}.',
)
CODE_TASKS = (
    "reverses the words of a sentence", "counts the vowels in a string", "merges two sorted lists",
    "checks whether a number is prime", "flattens a nested list", "parses a date in ISO format",
    "computes a moving average", "finds duplicate files by size", "validates an e-mail address",
    "reads a CSV file into dictionaries", "retries a function with backoff", "groups words by length",
)  # fmt: skip
CODE_ASKS = ("Write a Python function that {}, with a docstring.", "In JavaScript, write a function that {}.")
TOOL_ASKS = (
    "What's the weather in {} today?",
    "Search my notes for anything about {}.",
    "Is it raining in {}? Use Celsius.",
    "Find my three latest notes mentioning {}.",
)
PLACES = (
    "Paris", "Lima", "Oslo", "Kyoto", "Nairobi", "Quebec", "budgets", "the garden", "Mumbai", "Perth",
    "Cairo", "Seoul",
)  # fmt: skip


def prompts(per_kind: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``per_kind`` distinct chat request bodies (without model and limits) of each kind, or as
    many as its templates and subjects combine to (24 code tasks, 40 JSON asks; 208 for 48)."""
    rng = random.Random(seed)

    def pick(templates: tuple[str, ...], subjects: tuple[str, ...]) -> list[str]:
        combined = [t.format(x) for t, x in itertools.product(templates, subjects)]
        return rng.sample(combined, min(per_kind, len(combined)))

    def user(text: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}]}

    return {
        "prose": [user(t) for t in pick(PROSE, SUBJECTS)],
        "code": [user(t) for t in pick(CODE_ASKS, CODE_TASKS)],
        "json": [user(t) for t in pick(JSON_ASKS, SUBJECTS)],
        "tool-calls": [
            {"messages": [{"role": "user", "content": t}], "tools": TOOLS} for t in pick(TOOL_ASKS, PLACES)
        ],
        "languages": [user(t) for t in pick(tuple(LANGUAGES.values()), SUBJECTS)],
    }


def answer(url: str, body: dict[str, Any], max_tokens: int) -> tuple[Any, ...]:
    """The greedy answer: its text, its tool calls (without their random ids) and its tokens."""
    request = {"model": MODEL, "temperature": 0, "max_tokens": max_tokens, **body}
    reply = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=600).json()
    message = reply["choices"][0]["message"]
    calls = [call["function"] for call in message.get("tool_calls") or []]
    return message.get("content"), calls, reply["usage"]["completion_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-kind", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-sweep-"))
    prefix = f"kvpsweep-{random.getrandbits(32):08x}:"
    on, off = f"http://127.0.0.1:{ON_PORT}", f"http://127.0.0.1:{OFF_PORT}"
    total = same = 0
    lines = [
        MARKERS[0],
        f"## Speculation: the promise swept ({time.strftime('%Y-%m-%d')}, bench.speculation_sweep)",
        "",
        f"Greedy chat answers of up to {args.max_tokens} tokens from a server with speculation (the",
        "default) and one with `--no-speculation`, both `--no-cache`, compared whole (text, tool calls",
        "without their random ids, token count).",
        "",
        "| Kind | Prompts | Equal | Tokens | Drafted | Accepted |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    with (
        running(serve(ON_PORT, work / "on", prefix + "on:", "--no-cache")),
        running(serve(OFF_PORT, work / "off", prefix + "off:", "--no-cache", "--no-speculation")),
    ):
        for kind, bodies in prompts(args.per_kind).items():
            before = drafts(on)
            equal = tokens = 0
            for body in bodies:
                ours, theirs = answer(on, body, args.max_tokens), answer(off, body, args.max_tokens)
                equal += ours == theirs
                tokens += ours[2]
            drafted, accepted = (b - a for a, b in zip(before, drafts(on), strict=True))
            share = f"{accepted} ({accepted / drafted:.0%})" if drafted else "0"
            lines.append(f"| {kind} | {len(bodies)} | {equal} | {tokens} | {drafted} | {share} |")
            print(lines[-1], flush=True)
            total, same = total + len(bodies), same + equal
    lines += ["", f"Greedy answers with speculation equal to those without: {same} of {total}.", MARKERS[1]]
    splice(Path(args.out), lines, MARKERS)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
