"""Choosing a replica (pure: no I/O).

``cache-aware`` (the default), among healthy replicas, with load = requests in flight:

1. **balance** - the load is badly imbalanced (most - least > ``abs_threshold`` and
   most > least x ``rel_threshold``): among the replicas within ``abs_threshold`` of the least
   loaded, the one holding the longest prefix (ties: least loaded). A prompt everybody shares can
   then never pile every request onto one replica.
2. **affinity** - else the replica holding the longest prefix, if that prefix covers at least
   ``max(min_match_tokens, min_match_fraction x prompt)`` tokens (ties: least loaded).
3. **fallback** - else the less loaded of two replicas drawn at random ("power of two choices").

``least-loaded`` always takes step 3's least loaded replica (ties at random); ``round-robin``
takes them in turn. Source: SGLang's cache-aware router (its balance thresholds), vLLM
production-stack's prefix-aware router and the Gateway API inference extension's prefix plugin.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["cache-aware", "least-loaded", "round-robin"]
"""How the router chooses (``--policy``)."""
Decision = Literal["affinity", "balance", "fallback", "least_loaded", "round_robin", "retry"]
"""Why a replica was chosen (the ``x-kvproxy-route`` header and the metric label); ``retry``: a
second replica after the first failed before its first byte."""
Endpoint = Literal["chat", "completions", "responses", "messages", "gemini", "cached_contents"]
"""Which route a request came to (what the prompt is made of): chat and legacy completions, the
Responses API, Anthropic's Messages API, Gemini's ``generateContent`` (and its stream), and
Gemini's ``cachedContents`` create (a named cache's content: a prompt's start)."""


@dataclass(frozen=True)
class Thresholds:
    """The knobs of ``cache-aware`` (``--balance-*``, ``--route-min-match-*``)."""

    abs_threshold: int = 2
    rel_threshold: float = 1.5
    min_match_tokens: int = 128
    min_match_fraction: float = 0.5


@dataclass(frozen=True)
class Choice:
    """The replica chosen, why (``affinity``, ``balance``, ``fallback``, ``least_loaded``,
    ``round_robin``), and the tokens of its prefix the router expects it to hold."""

    replica: str
    decision: Decision
    predicted_tokens: int


def choose(
    policy: Policy,
    replicas: Sequence[str],
    matched_tokens: Mapping[str, int],
    loads: Mapping[str, int],
    prompt_tokens: int,
    thresholds: Thresholds,
    turn: int,
    rng: random.Random,
) -> Choice:
    """Pick one of ``replicas`` (non-empty, all healthy) for a prompt of ``prompt_tokens`` tokens.

    Args:
        matched_tokens: per replica, the tokens of the prompt's leading blocks it holds.
        loads: per replica, requests in flight (absent: 0).
        turn: a counter, for ``round-robin``.

    Raises:
        ValueError: no replica to choose from.
    """
    if not replicas:
        raise ValueError("no replica to choose from")

    def load(r: str) -> int:
        return loads.get(r, 0)

    def held(r: str) -> int:
        return matched_tokens.get(r, 0)

    def pick(candidates: Sequence[str], decision: Decision) -> Choice:
        best = max(candidates, key=lambda r: (held(r), -load(r)))
        return Choice(best, decision, held(best))

    if policy == "round-robin":
        replica = replicas[turn % len(replicas)]
        return Choice(replica, "round_robin", held(replica))
    if policy == "least-loaded":
        least = min(load(r) for r in replicas)
        replica = rng.choice([r for r in replicas if load(r) == least])
        return Choice(replica, "least_loaded", held(replica))
    least, most = min(load(r) for r in replicas), max(load(r) for r in replicas)
    if most - least > thresholds.abs_threshold and most > least * thresholds.rel_threshold:
        return pick([r for r in replicas if load(r) <= least + thresholds.abs_threshold], "balance")
    enough = max(thresholds.min_match_tokens, thresholds.min_match_fraction * prompt_tokens)
    best = pick(replicas, "affinity")
    if best.predicted_tokens > 0 and best.predicted_tokens >= enough:
        return best
    pair = rng.sample(list(replicas), min(2, len(replicas)))
    replica = min(pair, key=load)
    return Choice(replica, "fallback", held(replica))
