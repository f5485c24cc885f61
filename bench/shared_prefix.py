"""Shared system prompt: TTFT of a cached server vs a --no-cache server, side by side.

Sends two chat requests that share a long system prompt (real prose from Python's own
docstrings) and differ in the user question, to each server, and prints time to first token,
cached tokens and whether the completions agree.

    python -m bench.shared_prefix --cached http://127.0.0.1:8000/v1 --baseline http://127.0.0.1:8001/v1
"""

from __future__ import annotations

import argparse
import difflib
import heapq
import inspect
import subprocess

from bench.client import Client

SYSTEM = "\n\n".join(inspect.getdoc(m) or "" for m in (argparse, difflib, subprocess, heapq))
QUESTIONS = ["Summarize the first module in one sentence.", "Which class compares sequences?"]


def ask(client: Client, model: str, question: str, max_tokens: int) -> tuple[float, int, int, str]:
    """Stream one request: (TTFT seconds, prompt tokens, cached tokens, completion text)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    result, text = client.chat(model, messages, max_tokens)
    return result.ttft_s, result.prompt_tokens, result.cached_tokens, text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cached", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--baseline", default="http://127.0.0.1:8001/v1")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    print(f"{'server':<10} {'request':<9} {'prompt':>6} {'cached':>6} {'TTFT s':>8}  completion")
    results = {}
    for label, url in (("cached", args.cached), ("no-cache", args.baseline)):
        client = Client(url)
        for i, question in enumerate(QUESTIONS):
            ttft, prompt, cached, text = ask(client, args.model, question, args.max_tokens)
            results[label, i] = (ttft, text)
            print(f"{label:<10} {i + 1:<9} {prompt:>6} {cached:>6} {ttft:>8.3f}  {text[:60]!r}")
    same = results["cached", 1][1] == results["no-cache", 1][1]
    ratio = results["no-cache", 1][0] / results["cached", 1][0]
    print(f"second request: identical completion: {same}; TTFT no-cache / cached = {ratio:.1f}x")


if __name__ == "__main__":
    main()
