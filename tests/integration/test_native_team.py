"""The native decode step shares each step's work among the threads that run (``team.h``): whatever
the number of threads, the batch, the size of the units or how busy the cores are, every logit is
the same bit for bit, because each unit is computed the same way whoever computes it. Units of a
few bytes split even the tiny model's step into hundreds, so helpers take, and the leader takes
over, units in every phase."""

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
from engine.model.loading import load_model
from tests.helpers import build_tiny_source_model, random_tokens

PROMPTS = [random_tokens(520, seed=1), random_tokens(20, seed=2), random_tokens(300, seed=3)]
"""Pasts across three attention chunks of 256 positions, inside one, and across two."""
STEPS = 24


@pytest.fixture(scope="module")
def source_model(tmp_path_factory):
    path = build_tiny_source_model(tmp_path_factory.mktemp("source"))
    return load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))


def greedy_logits(loaded, threads: list[int], prompts: list[list[int]], unit_bytes: int) -> torch.Tensor:
    """The logits ``[STEPS, len(prompts), vocab]`` of ``STEPS`` greedy decode steps of the prompts,
    batched; step i on ``threads[i % len(threads)]`` threads."""
    decoder = NativeDecoder(loaded.model, loaded.codes, loaded.kernels, threads[0], unit_bytes)
    spec = loaded.kv_spec
    pool = BufferPool(torch.empty(spec.num_layers, spec.num_kv_heads, 0, spec.head_dim), keep=0)
    pasts = [past_from_blocks([], 0, pool.acquire(len(p) + STEPS), loaded.kernels) for p in prompts]
    with torch.inference_mode():
        for prompt, past in zip(prompts, pasts, strict=True):
            prefill(loaded.model, prompt, past, 0)
    tokens, steps = [5] * len(prompts), []
    for i in range(STEPS):
        decoder.threads = threads[i % len(threads)]
        logits = decoder(tokens, pasts, [len(p) + i for p in prompts])
        steps.append(logits.clone())
        tokens = [int(t) for t in logits.argmax(-1)]
    return torch.stack(steps)


@pytest.fixture
def busy_core() -> Iterator[None]:
    """A process spinning meanwhile: helpers are descheduled now and then, holding units the
    leader takes over."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def test_every_thread_count_and_unit_size_computes_the_same_bits(source_model) -> None:
    """1 thread against 2, 3 and 6 (more than the cores), units of 64 bytes to 64 KiB, and a thread
    count that changes from step to step: the same logits, bit for bit."""
    assert source_model.kernels is not None and source_model.codes
    alone = greedy_logits(source_model, [1], PROMPTS, 64 * 1024)
    for threads, unit_bytes in (([2], 64), ([3], 500), ([6], 2000), ([2, 1, 4, 3], 64), ([2], 64 * 1024)):
        assert torch.equal(greedy_logits(source_model, threads, PROMPTS, unit_bytes), alone), threads


def test_a_sequence_alone_gets_its_logits_in_the_batch(source_model) -> None:
    """The batch never changes a sequence's logits, shared among threads or not."""
    batched = greedy_logits(source_model, [3], PROMPTS, 64)
    assert torch.equal(greedy_logits(source_model, [3], PROMPTS[1:2], 64)[:, 0], batched[:, 1])


def test_a_busy_core_changes_no_bit(source_model, busy_core) -> None:
    """Beside a spinning process, with more threads than are free: the same logits."""
    alone = greedy_logits(source_model, [1], PROMPTS, 64)
    assert torch.equal(greedy_logits(source_model, [4], PROMPTS, 64), alone)
