"""engine/generate.py's Sampler: greedy, nucleus and penalties on plain logits."""

from __future__ import annotations

import torch

from engine.generate import Sampler, SamplingParams


def test_tiny_top_p_keeps_the_best_token() -> None:
    """top_p = 5e-324 (0 in float32) samples the most likely token instead of failing."""
    logits = torch.tensor([0.1, 3.0, 0.2])
    assert Sampler(SamplingParams(temperature=1.0, top_p=5e-324, seed=1))(logits) == 1


def test_greedy_and_penalties() -> None:
    """Greedy takes the argmax; a frequency penalty moves off a token once it was generated."""
    logits = torch.tensor([1.0, 1.5, 0.0])
    greedy = Sampler(SamplingParams(temperature=0.0))
    assert [greedy(logits) for _ in range(3)] == [1, 1, 1]
    penalized = Sampler(SamplingParams(temperature=0.0, frequency_penalty=1.0))
    assert [penalized(logits) for _ in range(3)] == [1, 0, 1]
