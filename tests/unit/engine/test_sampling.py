"""engine/sampling.py: the Sampler and log-probabilities: greedy, nucleus and penalties on plain logits."""

from __future__ import annotations

import torch

from engine.sampling import Sampler, SamplingParams, logprobs


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


def test_logit_bias_is_applied_on_the_logits_device() -> None:
    """A bias of +100 makes a token win; -100 bans the winner."""
    logits = torch.tensor([1.0, 1.5, 0.0])
    assert Sampler(SamplingParams(temperature=0.0, logit_bias=((2, 100.0),)))(logits) == 2
    assert Sampler(SamplingParams(temperature=0.0, logit_bias=((1, -100.0),)))(logits) == 0


def test_a_seed_makes_sampling_reproducible() -> None:
    """Two samplers with one seed draw the same tokens; the logits are never modified."""
    logits = torch.tensor([0.5, 0.4, 0.3, 0.2])
    a, b = (Sampler(SamplingParams(temperature=1.0, seed=7)) for _ in range(2))
    assert [a(logits) for _ in range(20)] == [b(logits) for _ in range(20)]
    assert torch.equal(logits, torch.tensor([0.5, 0.4, 0.3, 0.2]))


def test_logprobs_are_log_softmax_and_the_best_come_first() -> None:
    """The token's log-probability and the top-2 (id, log-probability), best first."""
    logits = torch.tensor([0.0, 2.0, 1.0])
    own, top = logprobs(logits, 2, 2)
    expected = torch.log_softmax(logits, dim=-1)
    assert own == float(expected[2])
    assert [i for i, _ in top] == [1, 2] and top[0][1] == float(expected[1])
    assert logprobs(logits, 0, 0)[1] == ()
