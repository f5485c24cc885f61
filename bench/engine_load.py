"""What a chat user feels, measured the same way on any OpenAI-compatible server: a round-robin
of multi-turn conversations with long system prompts, single-stream decode speed, and aggregate
speed of concurrent streams (every request greedy and streamed; tokens from usage when the
server sends it, else counted as content chunks)."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.client import Client, Result
from bench.workloads import QUESTIONS, corpus, text

DECODE_PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]


@dataclass(frozen=True)
class Conversations:
    """The conversation workload's outcome: wall seconds and each turn's requests (turn -> one
    ``Result`` per conversation, tokens from the server's usage)."""

    wall_s: float
    by_turn: list[list[Result]]

    @property
    def first_turn_p50_s(self) -> float:
        return statistics.median(r.ttft_s for r in self.by_turn[0])

    @property
    def later_turns_p50_s(self) -> float:
        return statistics.median(r.ttft_s for turn in self.by_turn[1:] for r in turn)

    @property
    def later_uncached_mean(self) -> float:
        """Mean prompt tokens computed (not from the cache) per request of turns 2 on."""
        return statistics.mean(r.prompt_tokens - r.cached_tokens for turn in self.by_turn[1:] for r in turn)

    @property
    def later_new_mean(self) -> float:
        """Mean tokens per request of turns 2 on that are neither the previous turn's prompt nor
        its answer: the new user message and the template's markers around the two messages."""
        pairs = zip(self.by_turn, self.by_turn[1:], strict=False)
        return statistics.mean(
            r.prompt_tokens - p.prompt_tokens - p.completion_tokens
            for before, after in pairs
            for p, r in zip(before, after, strict=True)
        )

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache over prompt tokens, every turn."""
        results = [r for turn in self.by_turn for r in turn]
        return sum(r.cached_tokens for r in results) / sum(r.prompt_tokens for r in results)

    @property
    def requests(self) -> int:
        return sum(len(turn) for turn in self.by_turn)


def conversations(
    client: Client,
    model: str,
    count: int = 6,
    turns: int = 3,
    system_tokens: int = 1500,
    reply_tokens: int = 24,
    seed: int = 0,
) -> Conversations:
    """``count`` conversations, each with a system prompt of its own of about ``system_tokens``
    tokens, asked round-robin (every conversation's turn 1, then every turn 2, ...); each turn
    sends the whole history and a new question and waits for a ``reply_tokens``-token answer."""
    rng, paragraphs = random.Random(seed), corpus()
    histories = [[{"role": "system", "content": text(rng, system_tokens, paragraphs)}] for _ in range(count)]
    asked = [rng.sample(QUESTIONS, turns) for _ in range(count)]
    by_turn: list[list[Result]] = [[] for _ in range(turns)]
    start = time.perf_counter()
    for turn in range(turns):
        for history, questions in zip(histories, asked, strict=True):
            history.append({"role": "user", "content": questions[turn]})
            result, answer = client.chat(model, history, reply_tokens)
            history.append({"role": "assistant", "content": answer})
            by_turn[turn].append(result)
    return Conversations(time.perf_counter() - start, by_turn)


def decode_speed(
    client: Client, model: str, tokens: int = 128, repeats: int = 3, ban: int | None = None
) -> float:
    """Median single-stream decode tokens per second over ``repeats`` ``tokens``-token answers."""
    extra = {"logit_bias": {str(ban): -100}} if ban is not None else {}
    rates = [
        client.chat(model, DECODE_PROMPT, tokens, **extra)[0].decode_tokens_per_s for _ in range(repeats)
    ]
    return statistics.median(rates)


def concurrent_speed(client: Client, model: str, streams: int, tokens: int = 64) -> float:
    """Aggregate tokens per second of ``streams`` simultaneous answers to distinct prompts."""
    prompts = [[{"role": "user", "content": f"{q} (request {i})"}] for i, q in enumerate(QUESTIONS * 2)]

    def one(messages: list[dict[str, str]]) -> Result:
        return client.chat(model, messages, tokens)[0]

    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(one, prompts[:streams]))
    return sum(r.completion_tokens for r in results) / (time.perf_counter() - start)


@contextlib.contextmanager
def hog() -> Iterator[int]:
    """A process spinning on one core (the last this process may use) meanwhile; yields the core."""
    core = max(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(1.0)  # NOTE: the scheduler has moved the servers' threads off its core by now
        yield core
    finally:
        spinner.kill()
        spinner.wait()
