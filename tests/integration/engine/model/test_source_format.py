"""The ``source`` weight format on a tiny model whose weights are GGUF block codes (Q4_0, Q4_1,
Q8_0): it is the default where the codes are, the native step computes on them and agrees with
transformers on the checkpoint they de-quantize to, a cached answer equals the cold one, and
where the format cannot run the choice is said and refused or fallen back from."""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.fetch import ModelError
from engine.model.loading import load_model
from engine.worker import Engine
from tests.helpers import (
    HANG_S,
    build_tiny_model,
    build_tiny_source_model,
    prefill_prompt,
    random_tokens,
    run_engine,
)


@pytest.fixture(scope="module")
def source_model(tmp_path_factory):
    path = build_tiny_source_model(tmp_path_factory.mktemp("source"))
    return path, load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))


def test_the_codes_are_the_default_format_and_the_native_step_runs_on_them(source_model) -> None:
    """auto picks ``source``: every matrix's codes are read (of each block type), the namespace
    names the format, and the decode step is the native one on the codes."""
    _, loaded = source_model
    assert loaded.weights == "source" and loaded.base_identity.weights == "source"
    assert len(loaded.codes) == 16 and {c.kind for c in loaded.codes.values()} == {"Q4_0", "Q4_1", "Q8_0"}
    engine = Engine(loaded, None)
    try:
        assert engine.decoder.name == "native, source codes"
    finally:
        engine.close()


def test_cached_equals_cold_and_source_equals_full(source_model, make_cache) -> None:
    """With 2 of 3 blocks cached: the cold greedy tokens and first logits within 1e-4; the full
    format on the same checkpoint (transformers' weights, the lean step) answers the same; a full
    hit computes one token; four requests batched answer as each alone."""
    path, loaded = source_model
    full = load_model(str(path), cache_dir=path.parent, weights="full")
    cached, cold, reference = Engine(loaded, make_cache(loaded)), Engine(loaded, None), Engine(full, None)
    try:
        prompt = tuple(random_tokens(300, seed=11))
        tokens, _, _ = run_engine(cold, prompt)
        assert run_engine(reference, prompt)[0] == tokens
        run_engine(cached, prompt[:256], max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(HANG_S)
        warm_logits, reused, _ = prefill_prompt(cached, prompt)
        cold_logits, _, _ = prefill_prompt(cold, prompt)
        assert reused == 256 and torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
        assert run_engine(cached, prompt) == (tokens, 256, "length")
        repeat = tuple(random_tokens(384, seed=12))
        alone = run_engine(cold, repeat)[0]
        run_engine(cached, repeat, max_tokens=1)
        assert cached.cache.flush(HANG_S)
        assert run_engine(cached, repeat) == (alone, 383, "length")  # one token fed, by the decode step
        prompts = [tuple(random_tokens(150 + 20 * i, seed=30 + i)) for i in range(4)]
        singles = [run_engine(cold, p)[0] for p in prompts]
        with ThreadPoolExecutor(4) as pool:
            batched = list(pool.map(lambda p: run_engine(cold, p)[0], prompts))
        assert batched == singles
    finally:
        for engine in (cached, cold, reference):
            engine.close()


def test_a_matrix_whose_codes_differ_is_served_from_its_float32_weight(tmp_path, caplog) -> None:
    """A checkpoint changed after conversion (one matrix): that matrix is computed from the
    checkpoint's weight (logged), the others from their codes, and the step still agrees."""
    path = build_tiny_source_model(tmp_path / "src")
    weights = load_file(path / "model.safetensors")
    weights["model.layers.1.mlp.down_proj.weight"] += 0.01
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.INFO, logger="engine.model.codes"):
        loaded = load_model(str(path), cache_dir=tmp_path)
    assert "blk.1.ffn_down.weight (Q4_1, codes differ from the checkpoint)" in caplog.text
    assert len(loaded.codes) == 15 and "model.layers.1.mlp.down_proj.weight" not in loaded.codes
    engine = Engine(loaded, None)
    try:
        assert engine.decoder.name == "native, source codes"
    finally:
        engine.close()


def test_the_comparison_is_kept_for_the_next_start(tmp_path) -> None:
    """The first load compares every matrix's codes with the checkpoint and keeps the outcome; the
    next reads the same codes without comparing (and compares again once the GGUF file changes)."""
    path = build_tiny_source_model(tmp_path / "src")
    first = load_model(str(path), cache_dir=tmp_path)
    (kept,) = (tmp_path / "fingerprints").glob("codes-*.json")
    second = load_model(str(path), cache_dir=tmp_path)
    assert set(second.codes) == set(first.codes)
    assert all(torch.equal(second.codes[n].data, c.data) for n, c in first.codes.items())
    assert (
        kept.stat().st_mtime_ns == next((tmp_path / "fingerprints").glob("codes-*.json")).stat().st_mtime_ns
    )


def test_where_the_source_format_cannot_run_it_is_said(tmp_path, caplog) -> None:
    """No GGUF source, or bfloat16: ``source`` is refused naming why, ``auto`` serves ``full``
    and says so; without a native step, auto is full too and the lean step decodes."""
    plain = build_tiny_model(tmp_path / "plain")
    with pytest.raises(ModelError, match="has no GGUF source"):
        load_model(str(plain), cache_dir=tmp_path, weights="source")
    source = build_tiny_source_model(tmp_path / "src")
    with pytest.raises(ModelError, match="computed in float32, not bfloat16"):
        load_model(str(source), cache_dir=tmp_path, dtype="bfloat16", weights="source")
    with caplog.at_level(logging.INFO, logger="engine.model.formats"):
        assert load_model(str(source), cache_dir=tmp_path, dtype="bfloat16").weights == "full"
    assert "weights: full (the source codes are computed in float32, not bfloat16)" in caplog.text
    loaded = dataclasses.replace(load_model(str(plain), cache_dir=tmp_path), kernels=None)
    engine = Engine(loaded, None)
    try:
        assert engine.decoder.name == "lean"
    finally:
        engine.close()
