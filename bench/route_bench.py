"""The router's hit rates, measured: three ``kvproxy serve`` replicas with separate caches behind
``kvproxy route``, fresh replicas for each policy, written into ``docs/router.md``.

    python -m bench.route_bench                      # the default model, prompts as token ids
    python -m bench.route_bench --hashing text       # the router without a tokenizer

Workloads: 8 conversations x 3 turns, each under its own ~1,000-token system prompt, asked
round-robin; 10 documents x 2 questions in a seeded random order; 8 concurrent clients sharing one
system prompt (the largest share of requests one replica got). Hit rate = sum of the
``cached_tokens`` the replicas report / sum of ``prompt_tokens``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import random
import re
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.servers import route, running, serve

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    "argparse",
    "difflib",
    "textwrap",
    "json",
    "logging",
    "subprocess",
    "threading",
    "zipfile",
    "csv",
    "shutil",
    "tarfile",
    "calendar",
]
MARK = re.compile(r"<!-- route-bench -->.*<!-- /route-bench -->", re.S)


def prose(n: int, chars: int = 4000) -> str:
    """About 1,000 tokens of real prose that ships with Python (module docs), seeded by ``n``."""
    text = inspect.getdoc(__import__(MODULES[n % len(MODULES)])) or ""
    return (text * 4)[:chars]


@contextlib.contextmanager
def stack(work: Path, policy: str, hashing: str, model: str) -> Iterator[str]:
    """Three fresh replicas and a router; yields the router's base URL."""
    tag = f"kvprb-{random.getrandbits(32):08x}"
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(3):
            port = 8621 + i
            stack.enter_context(running(serve(port, work / f"{tag}-{i}", f"{tag}:{i}:", "--model", model)))
            urls.append(f"http://127.0.0.1:{port}/v1")
        flags = ["--policy", policy, "--key-prefix", f"{tag}:route:"]
        flags += ["--tokenizer", model] if hashing == "tokens" else []
        stack.enter_context(running(route(8620, urls, *flags)))
        yield "http://127.0.0.1:8620"


def ask(base: str, messages: list[dict[str, str]], model: str) -> httpx.Response:
    body = {"model": model, "messages": messages, "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r


def conversations(base: str, model: str) -> float:
    convs = [[{"role": "system", "content": prose(n)}] for n in range(8)]
    cached = prompt = 0
    for turn in range(3):
        for n, messages in enumerate(convs):
            messages.append(
                {"role": "user", "content": f"Question {turn + 1}: what does part {n}.{turn} say?"}
            )
            r = ask(base, messages, model)
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            usage = r.json()["usage"]
            cached, prompt = (
                cached + usage["prompt_tokens_details"]["cached_tokens"],
                prompt + usage["prompt_tokens"],
            )
    return cached / prompt


def documents(base: str, model: str) -> float:
    asks = [(doc, q) for doc in range(10) for q in range(2)]
    random.Random(7).shuffle(asks)
    cached = prompt = 0
    for doc, q in asks:
        question = ["Summarize it in one sentence.", "Name one function it mentions."][q]
        usage = ask(base, [{"role": "user", "content": f"{prose(doc + 2)}\n\n{question}"}], model).json()[
            "usage"
        ]
        cached, prompt = (
            cached + usage["prompt_tokens_details"]["cached_tokens"],
            prompt + usage["prompt_tokens"],
        )
    return cached / prompt


def shared(base: str, model: str) -> float:
    """8 concurrent clients, one system prompt, 3 turns each: the largest share one replica got."""
    sent: Counter[str] = Counter()
    lock = threading.Lock()

    def client(n: int) -> None:
        messages = [{"role": "system", "content": prose(0)}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"Client {n}, question {turn + 1}: what is new?"})
            r = ask(base, messages, model)
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            with lock:
                sent[r.headers["x-kvproxy-replica"]] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(sent.values()) / sum(sent.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--hashing", choices=["tokens", "text"], default="tokens")
    parser.add_argument("--out", default=str(ROOT / "docs" / "router.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvproxy-route-bench-"))
    results: dict[str, Any] = {}
    for policy in ("cache-aware", "round-robin"):
        for name, workload in (
            ("conversations", conversations),
            ("documents", documents),
            ("shared", shared),
        ):
            with stack(work, policy, args.hashing, args.model) as base:
                results[f"{policy} {name}"] = workload(base, args.model)
            print(f"{policy} {name}: {results[f'{policy} {name}']:.3f}", flush=True)
    tag = f"kvprb-{random.getrandbits(32):08x}"
    with running(serve(8621, work / f"{tag}-single", f"{tag}:single:", "--model", args.model)):
        results["single conversations"] = conversations("http://127.0.0.1:8621", args.model)
    print(json.dumps(results, indent=1))
    write(Path(args.out), results, args)


def write(path: Path, r: dict[str, float], args: argparse.Namespace) -> None:
    aware, robin, single = (
        r["cache-aware conversations"],
        r["round-robin conversations"],
        r["single conversations"],
    )
    table = "\n".join(
        [
            "<!-- route-bench -->",
            f"Measured by `python -m bench.route_bench --hashing {args.hashing}` ({args.model},",
            "three replicas with separate caches, fresh replicas for each run; token hit rate =",
            "reported `cached_tokens` / `prompt_tokens`):",
            "",
            "| workload | cache-aware | round-robin | one replica alone | cache-aware / round-robin |",
            "| --- | --- | --- | --- | --- |",
            "| 8 conversations x 3 turns, own ~1,000-token system prompts "
            f"| {aware:.1%} | {robin:.1%} | {single:.1%} "
            f"| {f'{aware / robin:.2f}x' if robin else 'round-robin hits nothing'} "
            f"({aware / single:.0%} of one replica) |",
            f"| 10 documents x 2 questions, seeded random order | {r['cache-aware documents']:.1%} "
            f"| {r['round-robin documents']:.1%} | | "
            f"{r['cache-aware documents'] / max(r['round-robin documents'], 1e-9):.2f}x |",
            f"| 8 concurrent clients, one shared system prompt: largest share of requests on one replica "
            f"| {r['cache-aware shared']:.0%} | {r['round-robin shared']:.0%} | | |",
            "<!-- /route-bench -->",
        ]
    )
    text = path.read_text() if path.exists() else "<!-- route-bench --><!-- /route-bench -->\n"
    path.write_text(MARK.sub(lambda _: table, text))
    print(table)


if __name__ == "__main__":
    main()
