"""The engine's targets, against the peer a user would pick instead (llama-cpp-python's server on
the same GGUF, 2 threads, RAM prompt cache on):

- single-stream decode at least 1.5x llama.cpp's, in kvproxy's default format; 4 concurrent
  streams at least 2x llama.cpp's aggregate; the server's single stream within 20% of its own
  decode step's rate (from the server's ``kvproxy_decode_step*`` counters);
- turns 2-3 of the conversation workload at least 5x faster to first token than llama.cpp's, and
  computing no more than each turn's new message and the template's markers (the rest reused to
  the token: blocks and tails); what tails store and what they buy, against ``--no-tails``;
- a row per format (batch-1 decode, cold and hit TTFT), aggregate decode at 1, 4 and 8 streams;
- the promise: a cached answer is the cold answer (``bench.promise``) in each exact format, and
  the default format's answers against the float32 checkpoint's (``full``), on the sweep's
  prompts and 20 chat prompts;
- decode threads: 1 and 2, on a quiet machine and beside a busy core.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import httpx

from bench.client import Client
from bench.engine_load import concurrent_speed, conversations, decode_speed, hog
from bench.promise import sweep, sweep_prompts
from bench.servers import running, serve, serve_llama_cpp
from bench.workloads import QUESTIONS, corpus, text

MODEL = "smollm2-135m-instruct"
FORMATS = [("float32", "source"), ("float32", "full"), ("bfloat16", "full")]
SWEPT = [("float32", "source"), ("float32", "full")]
"""The formats the promise is swept in: the default one (the source's codes) and the checkpoint's."""
LLAMA_PORT, KVPROXY_PORT = 8620, 8621


EOS = 2
"""<|im_end|> of the SmolLM2 tokenizer: banned in the decode measurement, so every answer runs its
full length."""


def measure_engine(work: Path, prefix: str, llama: tuple[str, Path] | None) -> dict[str, Any]:
    """Every measurement of the engine's targets (servers run one at a time)."""
    out: dict[str, Any] = {"peers": {}, "formats": {}, "concurrency": {}, "sweep": {}, "threads": {}}
    out["stored"] = {}
    url = f"http://127.0.0.1:{KVPROXY_PORT}"
    peers: dict[str, tuple[Any, Client, str]] = {
        "kvproxy": (lambda: serve(KVPROXY_PORT, work / "e-blobs", prefix + "e:"), Client(f"{url}/v1"), MODEL),
        "kvproxy --no-cache": (
            lambda: serve(KVPROXY_PORT, work / "e-off", prefix + "eoff:", "--no-cache"),
            Client(f"{url}/v1"),
            MODEL,
        ),
        "kvproxy --no-tails": (
            lambda: serve(KVPROXY_PORT, work / "e-blocks", prefix + "eblocks:", "--no-tails"),
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
            talks = conversations(client, model)
            if label in ("kvproxy", "kvproxy --no-tails"):
                out["stored"][label] = stored_per_request(url, talks.requests)
            if label == "kvproxy --no-tails":  # NOTE: only the conversations, beside the default
                out["blocks_only"] = talks
                continue
            before = step_counters(url) if label == "kvproxy" else None
            out["peers"][label] = {
                "conversations": talks,
                "decode": decode_speed(client, model, ban=EOS),
                "format": health.get("format", "Q4_1 GGUF, 2 threads, RAM prompt cache"),
            }
            if before is not None:  # the decode measurement's own steps (one stream: batch 1)
                steps, seconds = (b - a for a, b in zip(before, step_counters(url), strict=True))
                out["step_tok_s"] = steps / seconds
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
        out["concurrency"]["kvproxy"] = {n: concurrent_speed(client, MODEL, n) for n in (1, 4, 8)}
        out["paris"] = client.chat(
            MODEL, [{"role": "user", "content": "What is the capital of France?"}], 24
        )[1]
    if llama is not None:
        with running(serve_llama_cpp(LLAMA_PORT, *llama)):
            _, client, model = peers["llama.cpp"]
            out["concurrency"]["llama.cpp"] = {n: concurrent_speed(client, model, n) for n in (1, 4, 8)}
    for threads in (1, 2):
        with running(
            serve(
                KVPROXY_PORT, work / f"t{threads}", f"{prefix}t{threads}:", "--decode-threads", str(threads)
            )
        ):
            client = Client(f"{url}/v1")
            quiet = decode_speed(client, MODEL, ban=EOS)
            with hog():
                loaded = decode_speed(client, MODEL, ban=EOS)
            out["threads"][threads] = {"quiet": quiet, "busy": loaded}
    for dtype, weights in SWEPT:
        flags = ("--dtype", dtype, "--weights", weights)
        cold_port = KVPROXY_PORT + 1
        with (
            running(serve(KVPROXY_PORT, work / f"s-{dtype}", f"{prefix}s{dtype}:", *flags)),
            running(serve(cold_port, work / f"s-off-{dtype}", f"{prefix}soff{dtype}:", "--no-cache", *flags)),
        ):
            label = httpx.get(f"{url}/health", timeout=10).json()["format"]
            out["sweep"][label] = sweep(url, f"http://127.0.0.1:{cold_port}", MODEL, sweep_prompts())
    full_port = KVPROXY_PORT + 1
    with (
        running(serve(KVPROXY_PORT, work / "x-source", f"{prefix}xs:", "--no-cache")),
        running(serve(full_port, work / "x-full", f"{prefix}xf:", "--no-cache", "--weights", "full")),
    ):
        prompts = sweep_prompts() + chat_prompts()
        out["against_full"] = sweep(url, f"http://127.0.0.1:{full_port}", MODEL, prompts)
    return out


CHATS = (
    "What is the capital of France?",
    "Name three rivers in Europe.",
    "Write a haiku about the sea.",
    "Explain what a prefix cache is in one sentence.",
    "What is 17 times 23?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "List the planets of the solar system.",
    "What does a CPU do?",
    "Suggest a name for a pet cat.",
    "How do I boil an egg?",
    "What is photosynthesis?",
    "Tell me a short joke.",
    "Who wrote Romeo and Juliet?",
    "What is the tallest mountain on Earth?",
    "Describe a rainy day in two sentences.",
    "What is the difference between weather and climate?",
    "How many legs does a spider have?",
    "Write one sentence about autumn.",
)
"""Twenty single-turn chats (the comparison of formats beside the sweep's completions)."""


def chat_prompts() -> list[str]:
    """``CHATS`` as the model's chat template (ChatML) renders them, for the completions route."""
    return [f"<|im_start|>user\n{chat}<|im_end|>\n<|im_start|>assistant\n" for chat in CHATS]


def stored_per_request(url: str, requests: int) -> dict[str, float]:
    """What the server stored per request so far (bytes of blocks and of tails, tails), from the
    deployment's counters and the blob store's size (``/stats``)."""
    stats = httpx.get(f"{url}/stats", timeout=10).json()["deployment"]
    tail_bytes = stats.get("tail_bytes_saved", 0)
    return {
        "tails": stats.get("tails_saved", 0) / requests,
        "tail_bytes": tail_bytes / requests,
        "block_bytes": (stats["bytes"] - tail_bytes) / requests,
    }


def step_counters(url: str) -> tuple[float, float]:
    """(decode steps, seconds inside them) so far, from a kvproxy server's ``/metrics``."""
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("kvproxy_decode_steps_total", "kvproxy_decode_step_seconds_total"):
            values[name] = float(value)
    return values["kvproxy_decode_steps_total"], values["kvproxy_decode_step_seconds_total"]


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
