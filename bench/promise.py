"""The promise, measured: prompts that share a prefix, answered by a cached server and by a
``--no-cache`` server in the same format; greedy answers must be identical, and where one is not,
the divergence may only start at a step where the cold answer's top two log-probabilities (so its
top two logits) are within ``NEAR_TIE`` of each other.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.workloads import corpus, text

NEAR_TIE = 0.05
"""A divergence is allowed only where the cold top-2 logit gap is below this (reduced formats)."""


@dataclass
class Divergence:
    """Where a cached answer first differs from the cold one, and the cold top-2 gap there."""

    prompt: int
    step: int
    gap: float

    @property
    def near_tie(self) -> bool:
        return self.gap < NEAR_TIE


@dataclass
class SweepResult:
    prompts: int = 0
    identical: int = 0
    cached_tokens: list[int] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    max_first_logprob_diff: float = 0.0  # over the top-5 alternatives of each first token

    @property
    def kept(self) -> bool:
        """Every answer identical, or every divergence at a near-tie."""
        return all(d.near_tie for d in self.divergences)


def sweep_prompts(count: int = 50, prefix_tokens: int = 384, seed: int = 0) -> list[str]:
    """``count`` prompts: one shared prefix of a little over ``prefix_tokens`` tokens of prose,
    then a distinct suffix of 20-60 tokens each."""
    rng, paragraphs = random.Random(seed), corpus()
    # NOTE: about 4 characters per token; a few more so the shared part covers the whole blocks
    prefix = text(rng, prefix_tokens + 40, paragraphs)
    return [
        f"{prefix}\n\n{text(rng, rng.randint(20, 60), paragraphs)}\n\nQuestion {i}:" for i in range(count)
    ]


def complete(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy completion with its token ids and top-5 log-probabilities per step."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 5,
        "return_token_ids": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def sweep(
    cached_url: str, cold_url: str, model: str, prompts: list[str], max_tokens: int = 64
) -> SweepResult:
    """Send every prompt to both servers (the cached one in order, so every prompt after the first
    finds the shared prefix) and compare the answers token by token."""
    result = SweepResult()
    for i, prompt in enumerate(prompts):
        warm, cold = (
            complete(cached_url, model, prompt, max_tokens),
            complete(cold_url, model, prompt, max_tokens),
        )
        result.prompts += 1
        result.cached_tokens.append(warm["usage"]["prompt_tokens_details"]["cached_tokens"])
        ours, theirs = warm["choices"][0], cold["choices"][0]
        first_ours, first_theirs = ours["logprobs"]["top_logprobs"][0], theirs["logprobs"]["top_logprobs"][0]
        shared = first_ours.keys() & first_theirs.keys()
        diff = max((abs(first_ours[t] - first_theirs[t]) for t in shared), default=0.0)
        result.max_first_logprob_diff = max(result.max_first_logprob_diff, diff)
        if ours["token_ids"] == theirs["token_ids"]:
            result.identical += 1
            continue
        step = next(
            (
                j
                for j, (a, b) in enumerate(zip(ours["token_ids"], theirs["token_ids"], strict=False))
                if a != b
            ),
            min(len(ours["token_ids"]), len(theirs["token_ids"])),
        )
        # NOTE: a server that ended at ``step`` (end of text) reports no alternatives there; the
        # other server's are of the same distribution up to the format's rounding.
        tops = theirs["logprobs"]["top_logprobs"] + [None] * max_tokens
        top = tops[step] or (ours["logprobs"]["top_logprobs"] + [{}] * max_tokens)[step]
        alternatives = sorted(top.values(), reverse=True)
        gap = alternatives[0] - alternatives[1] if len(alternatives) > 1 else float("inf")
        result.divergences.append(Divergence(i, step, gap))
    return result
