"""The engine's targets, against the peer a user would pick instead (llama-cpp-python's server on
the same GGUF, 2 threads, RAM prompt cache on):

- single-stream decode at least as fast as llama.cpp's, in kvproxy's default format;
- turns 2-3 of the conversation workload at least 3x faster to first token than llama.cpp's;
- a row per format (batch-1 decode, cold and hit TTFT), aggregate decode at 1, 4 and 8 streams;
- the promise: a cached answer is the cold answer (``bench.promise``), in the default (exact)
  format and in each fast one.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import httpx

from bench.client import Client
from bench.engine_load import concurrent_speed, conversations, decode_speed
from bench.promise import sweep, sweep_prompts
from bench.servers import running, serve, serve_llama_cpp
from bench.workloads import QUESTIONS, corpus, text

MODEL = "smollm2-135m-instruct"
FORMATS = [("float32", "full"), ("bfloat16", "full"), ("bfloat16", "int8"), ("bfloat16", "int4")]
SWEPT = [("float32", "full"), ("bfloat16", "int8"), ("bfloat16", "int4")]
"""The formats the promise is swept in: the default (exact) one and the fast ones."""
LLAMA_PORT, KVPROXY_PORT = 8620, 8621


EOS = 2
"""<|im_end|> of the SmolLM2 tokenizer: banned in the decode measurement, so every answer runs its
full length."""


def measure_engine(work: Path, prefix: str, llama: tuple[str, Path] | None) -> dict[str, Any]:
    """Every measurement of the engine's targets (servers run one at a time)."""
    out: dict[str, Any] = {"peers": {}, "formats": {}, "concurrency": {}, "sweep": {}}
    url = f"http://127.0.0.1:{KVPROXY_PORT}"
    peers: dict[str, tuple[Any, Client, str]] = {
        "kvproxy": (lambda: serve(KVPROXY_PORT, work / "e-blobs", prefix + "e:"), Client(f"{url}/v1"), MODEL),
        "kvproxy --no-cache": (
            lambda: serve(KVPROXY_PORT, work / "e-off", prefix + "eoff:", "--no-cache"),
            Client(f"{url}/v1"),
            MODEL,
        ),
    }
    if llama is not None:
        llama_client = Client(f"http://127.0.0.1:{LLAMA_PORT}/v1", require_usage=False)
        peers["llama.cpp"] = (lambda: serve_llama_cpp(LLAMA_PORT, *llama), llama_client, "smollm2")
    for label, (start, client, model) in peers.items():
        with running(start()):
            health = httpx.get(f"{url}/health", timeout=10).json() if label.startswith("kvproxy") else {}
            out["peers"][label] = {
                "conversations": conversations(client, model),
                "decode": decode_speed(client, model, ban=EOS),
                "format": health.get("format", "Q4_1 GGUF, 2 threads, RAM prompt cache"),
            }
    if llama is not None:  # the decode comparison again, alternating, both servers up
        with (
            running(serve(KVPROXY_PORT, work / "e2-blobs", prefix + "e2:")),
            running(serve_llama_cpp(LLAMA_PORT, *llama)),
        ):
            rounds: dict[str, list[float]] = {"kvproxy": [], "llama.cpp": []}
            for _ in range(3):
                for label in rounds:
                    _, client, model = peers[label]
                    rounds[label].append(decode_speed(client, model, repeats=1, ban=EOS))
            out["decode_alternating"] = {k: statistics.median(v) for k, v in rounds.items()}
    for dtype, weights in FORMATS:
        with running(
            serve(
                KVPROXY_PORT,
                work / f"f-{dtype}-{weights}",
                f"{prefix}f{dtype}{weights}:",
                "--dtype",
                dtype,
                "--weights",
                weights,
            )
        ):
            out["formats"][f"{dtype}/{weights}"] = format_row(Client(f"{url}/v1"), url)
    with running(serve(KVPROXY_PORT, work / "c-blobs", prefix + "c:", "--max-batch", "8")):
        client = Client(f"{url}/v1")
        out["concurrency"] = {n: concurrent_speed(client, MODEL, n) for n in (1, 4, 8)}
    for dtype, weights in SWEPT:
        flags = ("--dtype", dtype, "--weights", weights)
        cold_port = KVPROXY_PORT + 1
        with (
            running(serve(KVPROXY_PORT, work / f"s-{dtype}", f"{prefix}s{dtype}:", *flags)),
            running(serve(cold_port, work / f"s-off-{dtype}", f"{prefix}soff{dtype}:", "--no-cache", *flags)),
        ):
            label = httpx.get(f"{url}/health", timeout=10).json()["format"]
            out["sweep"][label] = sweep(url, f"http://127.0.0.1:{cold_port}", MODEL, sweep_prompts())
    return out


def format_row(client: Client, url: str) -> dict[str, Any]:
    """Batch-1 decode tok/s, and cold and hit TTFT of a chat with a 1,500-token system prompt."""
    rng = random.Random(5)
    system = {"role": "system", "content": text(rng, 1500, corpus())}
    cold = client.chat(MODEL, [system, {"role": "user", "content": QUESTIONS[0]}], 8)[0]
    hit = client.chat(MODEL, [system, {"role": "user", "content": QUESTIONS[1]}], 8)[0]
    return {
        "format": httpx.get(f"{url}/health", timeout=10).json()["format"],
        "decode": decode_speed(client, MODEL, ban=EOS),
        "cold_ttft_s": cold.ttft_s,
        "hit_ttft_s": hit.ttft_s,
        "hit_cached_tokens": hit.cached_tokens,
    }
