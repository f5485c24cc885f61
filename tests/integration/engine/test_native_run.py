"""The native multi-token step (``NativeDecoder.run``): M tokens of one sequence in one call are bit
for bit M single steps, for every M up to ``MAX_RUN_TOKENS`` and beyond it (in calls of that many),
on pasts of 0 and a few positions, across a 128-token block, across an attention chunk of 256
positions, and longer than a sliding window: the logits of every row and the K/V the run leaves;
on each code path the machine has (``KERNEL_PATHS``).
Every run starts on a buffer with room for its past and one more position, so the run grows it
(a moved buffer) before any row is computed."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from engine.forward import prefill
from engine.kernels.build import compiler
from engine.kernels.native import MAX_RUN_TOKENS, NativeDecoder
from engine.kv import past_from_blocks
from engine.model.loading import load_model
from tests.helpers import (
    KERNEL_PATHS,
    build_tiny_model,
    build_tiny_source_model,
    on_kernel_path,
    random_tokens,
)

pytestmark = pytest.mark.skipif(compiler() is None, reason="the native step needs a C++ compiler")

PASTS = {"source": [0, 3, 100, 230], "mistral-window": [0, 40, 100]}
"""Past lengths per model: none, a few, a run that crosses block 1 (100 + M > 128) and one that
crosses the first attention chunk (230 + M > 256); the windowed model's window is 48 positions."""


@pytest.fixture(
    scope="module",
    params=[(m, k) for m in sorted(PASTS) for k in KERNEL_PATHS],
    ids=lambda param: "-".join(param),
)
def model(request, tmp_path_factory):
    name, kernel_path = request.param
    path = tmp_path_factory.mktemp(name)
    if name == "source":
        build_tiny_source_model(path)
    else:
        build_tiny_model(path, family=name)
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    assert loaded.kernels is not None
    return name, on_kernel_path(loaded, kernel_path, tmp_path_factory.mktemp("kernels"))


def _past(loaded, base: DynamicCache | None, length: int, capacity: int) -> DynamicCache:
    """A past holding ``base``'s first ``length`` positions, in buffers of ``capacity`` positions."""
    spec = loaded.kv_spec
    shape = (spec.num_layers, 1, spec.num_kv_heads, capacity, spec.head_dim)
    past = past_from_blocks([], 0, (torch.empty(shape), torch.empty(shape)))
    for layer, source in zip(past.layers, base.layers if base is not None else [], strict=False):
        layer.update(source.keys[:, :, :length], source.values[:, :, :length])
    return past


def test_a_run_is_bit_for_bit_its_single_steps(model) -> None:
    """For M = 1..64 (and 64 + 9, two calls) at each past length: ``run``'s logits ``[M, vocab]``
    and the K/V of every layer equal M single decode steps', exactly (torch.equal)."""
    name, loaded = model
    decoder = NativeDecoder(loaded.model, loaded.codes, loaded.kernels, threads=2, unit_bytes=256)
    longest = MAX_RUN_TOKENS + 9
    for length in PASTS[name]:
        prompt = random_tokens(length, seed=length)
        base = None
        if length:
            base = _past(loaded, None, 0, length)
            with torch.inference_mode():
                prefill(loaded.model, prompt, base, 0)
        run = random_tokens(longest, seed=1000 + length)
        single = _past(loaded, base, length, length + longest)
        steps = torch.stack([decoder([token], [single], [length + i])[0] for i, token in enumerate(run)])
        for m in [*range(1, MAX_RUN_TOKENS + 1), longest]:
            past = _past(loaded, base, length, length + 1)
            logits = decoder.run(run[:m], past, length)
            assert past.get_seq_length() == length + m
            assert torch.equal(logits, steps[:m]), (name, length, m)
            for layer, expected in zip(past.layers, single.layers, strict=True):
                assert torch.equal(layer.keys, expected.keys[:, :, : length + m]), (name, length, m)
                assert torch.equal(layer.values, expected.values[:, :, : length + m]), (name, length, m)
