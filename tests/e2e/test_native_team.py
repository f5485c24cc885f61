"""The native decode step on the default model's real shapes, its work shared among the threads that
run (``engine/kernels/team.h``, units of its default size): whatever the number of threads, the
batch, or how busy the cores are, every logit is the same bit for bit
(``tests/integration/engine/test_native_team.py`` covers unit sizes and thread counts on a tiny model)."""

from __future__ import annotations

import torch

from tests.helpers import busy_core, native_greedy_logits

PROMPTS = [
    [1 + i % 50 for i in range(600)],
    [3 + i % 17 for i in range(40)],
    [7 + i % 29 for i in range(300)],
]
"""Pasts of 600 (three attention chunks of 256 positions), 40 and 300 tokens."""
STEPS = 12


def test_every_thread_count_computes_the_same_bits(default_model) -> None:
    """1, 2 and 5 threads (more than the cores): the same logits, bit for bit; one sequence alone
    gets the same logits as in the batch."""
    assert default_model.kernels is not None
    one = native_greedy_logits(default_model, [1], PROMPTS, STEPS)
    for threads in (2, 5):
        assert torch.equal(native_greedy_logits(default_model, [threads], PROMPTS, STEPS), one)
    assert torch.equal(native_greedy_logits(default_model, [2], PROMPTS[:1], STEPS)[:, 0], one[:, 0])


def test_a_busy_core_changes_no_bit(default_model) -> None:
    """Beside a spinning process, with more threads than are free: the same logits."""
    alone = native_greedy_logits(default_model, [1], PROMPTS, STEPS)
    with busy_core():
        assert torch.equal(native_greedy_logits(default_model, [3], PROMPTS, STEPS), alone)
