"""The native decode step shares each step's work among the threads that run (``team.h``): whatever
the number of threads, the batch, the size of the units or how busy the cores are, every logit is
the same bit for bit, because each unit is computed the same way whoever computes it. Units of a
few bytes split even the tiny model's step into hundreds, so helpers take, and the leader takes
over, units in every phase. On each code path the machine has (``KERNEL_PATHS``: on an AVX-512 CPU
also the AVX2 path), which also agrees with transformers' forward as the start-up check asks."""

from __future__ import annotations

import pytest
import torch

from engine.decoding import pick_decoder
from engine.forward import use_batched_attention
from engine.model.loading import load_model
from tests.helpers import (
    KERNEL_PATHS,
    build_tiny_source_model,
    busy_core,
    native_greedy_logits,
    on_kernel_path,
    random_tokens,
)

PROMPTS = [random_tokens(520, seed=1), random_tokens(20, seed=2), random_tokens(300, seed=3)]
"""Pasts across three attention chunks of 256 positions, inside one, and across two."""
STEPS = 24


@pytest.fixture(scope="module", params=KERNEL_PATHS)
def source_model(request, tmp_path_factory):
    path = build_tiny_source_model(tmp_path_factory.mktemp("source"))
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    return on_kernel_path(loaded, request.param, tmp_path_factory.mktemp("kernels"))


def test_the_step_agrees_with_transformers(source_model) -> None:
    """The start-up check (``pick_decoder``: logits within 1e-4 of transformers' forward, batched
    and alone) picks the native step on this code path."""
    spec = source_model.kv_spec
    like = torch.empty(spec.num_layers, spec.num_kv_heads, 0, spec.head_dim)
    use_batched_attention(source_model.model)  # NOTE: as the engine does before the check
    assert pick_decoder(source_model, like, 2).name.startswith("native")


def test_every_thread_count_and_unit_size_computes_the_same_bits(source_model) -> None:
    """1 thread against 2, 3 and 6 (more than the cores), units of 64 bytes to 64 KiB, and a thread
    count that changes from step to step: the same logits, bit for bit."""
    assert source_model.kernels is not None and source_model.codes
    alone = native_greedy_logits(source_model, [1], PROMPTS, STEPS, 64 * 1024)
    for threads, unit_bytes in (([2], 64), ([3], 500), ([6], 2000), ([2, 1, 4, 3], 64), ([2], 64 * 1024)):
        assert torch.equal(native_greedy_logits(source_model, threads, PROMPTS, STEPS, unit_bytes), alone), (
            threads
        )


def test_a_sequence_alone_gets_its_logits_in_the_batch(source_model) -> None:
    """The batch never changes a sequence's logits, shared among threads or not, whichever its row
    (the first row of a batch once differed, on a CPU without AVX-512: ``madd`` in decode.cpp)."""
    batched = native_greedy_logits(source_model, [3], PROMPTS, STEPS, 64)
    for row, prompt in enumerate(PROMPTS):
        alone = native_greedy_logits(source_model, [3], [prompt], STEPS, 64)
        assert torch.equal(alone[:, 0], batched[:, row]), row


def test_a_busy_core_changes_no_bit(source_model) -> None:
    """Beside a spinning process, with more threads than are free (helpers descheduled now and
    then, holding units the leader takes over): the same logits."""
    alone = native_greedy_logits(source_model, [1], PROMPTS, STEPS, 64)
    with busy_core():
        assert torch.equal(native_greedy_logits(source_model, [4], PROMPTS, STEPS, 64), alone)
