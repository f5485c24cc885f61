"""Hit-vs-cold time to first token and decode speed of ``kvproxy serve`` on one device, per format.

Runs where nothing can be downloaded (a GPU machine without network): the model is a checkpoint
directory given with ``--model`` (``bench/device_check.sh`` writes a randomly initialised one of
the default model's shape: speed depends on shapes, not on weights), and the index lives in the
server's memory (``--redis-url memory://``), so no Redis is needed either.

    python -m bench.device_bench --model DIR --device cuda [--prompt-tokens 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.servers import serve

FORMATS = {
    "cuda": [("bfloat16", "full"), ("float32", "full")],
    "cpu": [("bfloat16", "full"), ("float32", "full")],
}


def stream(
    url: str, model: str, prompt: list[int], max_tokens: int, ban: int | None
) -> tuple[float, list[float], dict]:
    """One streamed completion: (TTFT seconds, arrival time of each token, usage)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if ban is not None:
        body["logit_bias"] = {str(ban): -100}
    start, arrivals, usage = time.perf_counter(), list[float](), dict[str, Any]()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    arrivals += [time.perf_counter()] * len(choice.get("token_ids") or [])
    return arrivals[0] - start, arrivals, usage


def measure(url: str, prompt_tokens: int, ban: int | None) -> dict[str, float]:
    """Cold and hit TTFT of one prompt, single-stream decode tok/s, and aggregate tok/s of 4 and 8
    concurrent streams."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    prompt = [10 + (i * 7919) % 380 for i in range(prompt_tokens)]
    cold, _, _ = stream(url, model, prompt, 1, ban)
    hits = []
    for _ in range(40):  # the blocks are saved in the background: wait for the first hit
        ttft, _, usage = stream(url, model, prompt, 1, ban)
        if usage.get("prompt_tokens_details", {}).get("cached_tokens"):
            hits.append(ttft)
            if len(hits) == 5:
                break
        else:
            time.sleep(0.2)
    out = {"cold_ttft_s": cold, "hit_ttft_s": statistics.median(hits) if hits else float("nan")}
    _, arrivals, _ = stream(url, model, prompt[:64], 128, ban)
    out["decode_tok_s"] = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    for concurrency in (4, 8):
        prompts = [[11 + (c * 31 + i) % 370 for i in range(64)] for c in range(concurrency)]
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            runs = list(pool.map(lambda p: stream(url, model, p, 64, ban)[1], prompts))
        out[f"decode_tok_s_x{concurrency}"] = sum(len(r) for r in runs) / (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--port", type=int, default=8710)
    args = parser.parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    ban = config.get("eos_token_id")
    rows = []
    for i, (dtype, weights) in enumerate(FORMATS["cuda" if args.device.startswith("cuda") else "cpu"]):
        work = Path(tempfile.mkdtemp(prefix="kvproxy-device-"))
        flags = ["--model", args.model, "--device", args.device, "--dtype", dtype, "--weights", weights]
        flags += ["--redis-url", "memory://"]
        server = serve(args.port + i, work / "blobs", "bench:", *flags)
        try:
            url = f"http://127.0.0.1:{args.port + i}"
            health = httpx.get(f"{url}/health", timeout=10).json()
            rows.append(
                (f"{dtype}/{weights}", health.get("format", ""), measure(url, args.prompt_tokens, ban))
            )
        finally:
            server.terminate()
            server.wait(60)
    print(
        f"\n| device {args.device}, {args.prompt_tokens}-token prompt | format | cold TTFT s | hit TTFT s "
        "| decode tok/s (1 stream) | x4 aggregate | x8 aggregate |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for asked, resolved, m in rows:
        ttft = f"{m['cold_ttft_s']:.3f} | {m['hit_ttft_s']:.3f}"
        decode = f"{m['decode_tok_s']:.1f} | {m['decode_tok_s_x4']:.1f} | {m['decode_tok_s_x8']:.1f}"
        print(f"| {asked} | {resolved} | {ttft} | {decode} |")


if __name__ == "__main__":
    main()
