"""proxy/router/policy.py: the choice is a pure function of loads, held prefixes and the policy."""

from __future__ import annotations

import random

import pytest

from proxy.router.policy import Choice, Thresholds, choose

A, B, C = "http://a/v1", "http://b/v1", "http://c/v1"
LIMITS = Thresholds(abs_threshold=2, rel_threshold=1.5, min_match_tokens=128, min_match_fraction=0.5)


def pick(policy="cache-aware", matched=None, loads=None, prompt=1000, turn=0, seed=0) -> Choice:
    return choose(policy, [A, B, C], matched or {}, loads or {}, prompt, LIMITS, turn, random.Random(seed))


def test_affinity_takes_the_replica_holding_the_longest_prefix() -> None:
    """A prefix covering half the prompt or more wins over load, within the balance limits."""
    assert pick(matched={A: 256, B: 640}, loads={B: 1}) == Choice(B, "affinity", 640)


def test_a_short_match_is_no_reason_to_pin() -> None:
    """Under max(128 tokens, half the prompt) held, the choice falls back to two random choices."""
    choice = pick(matched={A: 384}, loads={A: 0, B: 0, C: 0})
    assert choice.decision == "fallback" and choice.replica in (A, B, C)


def test_ties_in_the_prefix_go_to_the_least_loaded() -> None:
    """Two replicas holding the same prefix: the one with fewer requests in flight."""
    assert pick(matched={A: 768, B: 768}, loads={A: 2, B: 1}).replica == B


def test_imbalance_overrides_affinity() -> None:
    """When the most loaded has more than 2 over and 1.5x the least, only replicas within 2 of the
    least loaded are candidates; among them, the longest prefix."""
    choice = pick(matched={A: 1000, B: 256}, loads={A: 6, B: 1, C: 0})
    assert choice == Choice(B, "balance", 256)


def test_fallback_is_the_less_loaded_of_two() -> None:
    """With nothing held, the less loaded of the two drawn replicas, for every draw."""
    for seed in range(20):
        choice = pick(loads={A: 1, B: 1, C: 0}, seed=seed)
        assert choice.decision == "fallback"
        drawn = random.Random(seed).sample([A, B, C], 2)
        assert choice.replica == min(drawn, key={A: 1, B: 1, C: 0}.get)


def test_round_robin_and_least_loaded_ignore_prefixes() -> None:
    """round-robin takes the replicas in turn; least-loaded the least loaded (ties at random)."""
    assert [pick("round-robin", matched={A: 999}, turn=t).replica for t in range(4)] == [A, B, C, A]
    assert pick("least-loaded", matched={A: 999}, loads={A: 3, B: 0, C: 1}) == Choice(B, "least_loaded", 0)


def test_no_replica_is_an_error() -> None:
    """An empty candidate list raises (the caller answers 503)."""
    with pytest.raises(ValueError, match="no replica"):
        choose("cache-aware", [], {}, {}, 10, LIMITS, 0, random.Random(0))
