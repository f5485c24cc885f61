"""Timed streaming requests against any OpenAI-compatible server, on httpx.

Every request streams: time to first token (TTFT) is taken when the first chunk carrying content
arrives; token counts, ``cached_tokens`` and so the hit rate come from the server's own usage
(``stream_options.include_usage``). One ``httpx.Client`` serves every request, so connection and
TLS set-up are never part of a measured time.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.workloads import Session, Workload


class BenchError(RuntimeError):
    """The server answered with an error, or without the usage the bench needs."""


@dataclass
class Result:
    """One request as measured by the client (seconds; tokens from the server's usage)."""

    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    last_token_s: float = 0.0  # seconds to the last content chunk

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the first (0 when there was only one)."""
        span = self.last_token_s - self.ttft_s
        return (self.completion_tokens - 1) / span if span > 0 and self.completion_tokens > 1 else 0.0


@dataclass
class Summary:
    workload: str
    requests: int
    ttft_p50_s: float
    ttft_p95_s: float
    latency_p50_s: float
    latency_p95_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    wall_s: float
    results: list[Result] = field(default_factory=list)


class Client:
    """Streaming requests to ``base_url`` (an OpenAI ``/v1`` URL) with a Bearer ``api_key``.

    Args:
        require_usage: a stream without usage is an error; else (a server that never sends it,
            as llama-cpp-python's) tokens are counted as content chunks and nothing as cached.
    """

    def __init__(
        self, base_url: str, api_key: str = "unused", timeout_s: float = 900.0, require_usage: bool = True
    ) -> None:
        self.base_url, self.require_usage = base_url.rstrip("/"), require_usage
        self.http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=10.0), headers={"Authorization": f"Bearer {api_key}"}
        )

    def chat(
        self, model: str, messages: list[dict[str, str]], max_tokens: int, **extra: Any
    ) -> tuple[Result, str]:
        """One greedy streamed chat completion: its ``Result`` and its text."""
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0} | extra
        return self._stream("/chat/completions", body, lambda c: c.get("delta", {}).get("content"))

    def complete(
        self, model: str, prompt: str | list[int], max_tokens: int, **extra: Any
    ) -> tuple[Result, str]:
        """One greedy streamed (legacy) completion: its ``Result`` and its text."""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0} | extra
        return self._stream("/completions", body, lambda c: c.get("text"))

    def _stream(
        self, path: str, body: dict[str, Any], content: Callable[[dict], str | None]
    ) -> tuple[Result, str]:
        body = body | {"stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        ttft, last, parts, usage = None, 0.0, [], None
        with self.http.stream("POST", self.base_url + path, json=body) as response:
            if response.status_code != 200:
                raise BenchError(f"{path}: HTTP {response.status_code}: {response.read().decode()[:300]}")
            for chunk in _events(response.iter_lines()):
                text = next((content(c) for c in chunk.get("choices", [])), None)
                if text:
                    last = time.perf_counter() - start
                    ttft = ttft if ttft is not None else last
                    parts.append(text)
                usage = chunk.get("usage") or usage
        latency = time.perf_counter() - start
        if usage is None and self.require_usage:
            raise BenchError(f"{path}: the server sent no usage (stream_options.include_usage)")
        usage = usage or {"prompt_tokens": 0, "completion_tokens": len(parts)}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        result = Result(
            ttft if ttft is not None else latency,
            latency,
            usage["prompt_tokens"],
            cached,
            usage["completion_tokens"],
            last,
        )
        return result, "".join(parts)


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to ``data: [DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise BenchError(f"error in the stream: {chunk['error']}")
        yield chunk


def run(
    client: Client,
    model: str,
    workload: Workload,
    *,
    concurrency: int = 1,
    max_tokens: int = 16,
    on_result: Callable[[Result], None] = lambda _: None,
) -> Summary:
    """Send a workload; sessions run ``concurrency`` at a time, the turns of one in order."""

    def session(s: Session) -> list[Result]:
        messages, results = [{"role": "system", "content": s.system}], []
        for turn in s.turns:
            question = {"role": "user", "content": turn}
            messages = [*messages, question] if s.chat else [messages[0], question]
            result, answer = client.chat(model, messages, max_tokens)
            if s.chat:
                messages.append({"role": "assistant", "content": answer})
            on_result(result)
            results.append(result)
        return results

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = [r for rs in pool.map(session, workload.sessions) for r in rs]
    return summarize(workload.name, results, time.perf_counter() - start)


def summarize(name: str, results: list[Result], wall_s: float) -> Summary:
    """Percentiles, throughput (output tokens over ``wall_s`` seconds) and hit rate."""

    def pct(values: list[float], q: int) -> float:
        return (
            statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]
        )

    ttfts, latencies = [r.ttft_s for r in results], [r.latency_s for r in results]
    prompt, cached = sum(r.prompt_tokens for r in results), sum(r.cached_tokens for r in results)
    return Summary(
        name,
        len(results),
        statistics.median(ttfts),
        pct(ttfts, 95),
        statistics.median(latencies),
        pct(latencies, 95),
        sum(r.completion_tokens for r in results) / wall_s,
        prompt,
        cached,
        cached / prompt if prompt else 0.0,
        wall_s,
        results,
    )


def to_json(summaries: list[Summary]) -> str:
    return json.dumps([asdict(s) for s in summaries], indent=2)
