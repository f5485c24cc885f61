"""The native decode step on the default model's real shapes, its work shared among the threads that
run (``engine/kernels/team.h``, units of its default size): whatever the number of threads, the
batch, or how busy the cores are, every logit is the same bit for bit
(``tests/integration/test_native_team.py`` covers unit sizes and thread counts on a tiny model)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from engine.buffers import BufferPool
from engine.forward import prefill
from engine.kernels.native import NativeDecoder
from engine.kv import past_from_blocks

PROMPTS = [
    [1 + i % 50 for i in range(600)],
    [3 + i % 17 for i in range(40)],
    [7 + i % 29 for i in range(300)],
]
"""Pasts of 600 (three attention chunks of 256 positions), 40 and 300 tokens."""
STEPS = 12


def greedy_logits(loaded, threads: int, prompts: list[list[int]]) -> torch.Tensor:
    """The logits ``[STEPS, len(prompts), vocab]`` of ``STEPS`` greedy decode steps of the prompts,
    batched, on ``threads`` threads."""
    decoder = NativeDecoder(loaded.model, loaded.codes, loaded.kernels, threads)
    spec = loaded.kv_spec
    pool = BufferPool(torch.empty(spec.num_layers, spec.num_kv_heads, 0, spec.head_dim), keep=0)
    pasts = [past_from_blocks([], 0, pool.acquire(len(p) + STEPS), loaded.kernels) for p in prompts]
    with torch.inference_mode():
        for prompt, past in zip(prompts, pasts, strict=True):
            prefill(loaded.model, prompt, past, 0)
    tokens, steps = [5] * len(prompts), []
    for i in range(STEPS):
        logits = decoder(tokens, pasts, [len(p) + i for p in prompts])
        steps.append(logits.clone())
        tokens = [int(t) for t in logits.argmax(-1)]
    return torch.stack(steps)


@pytest.fixture
def busy_core() -> Iterator[None]:
    """A process spinning meanwhile: the team's helpers are descheduled now and then, and the
    units they hold are taken over."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def test_every_thread_count_computes_the_same_bits(default_model) -> None:
    """1, 2 and 5 threads (more than the cores): the same logits, bit for bit; one sequence alone
    gets the same logits as in the batch."""
    assert default_model.kernels is not None
    one = greedy_logits(default_model, 1, PROMPTS)
    for threads in (2, 5):
        assert torch.equal(greedy_logits(default_model, threads, PROMPTS), one)
    assert torch.equal(greedy_logits(default_model, 2, PROMPTS[:1])[:, 0], one[:, 0])


def test_a_busy_core_changes_no_bit(default_model, busy_core) -> None:
    """Beside a spinning process, with more threads than are free: the same logits."""
    assert torch.equal(greedy_logits(default_model, 3, PROMPTS), greedy_logits(default_model, 1, PROMPTS))
