"""Every model family kvproxy claims, on a tiny random configuration (float32, real Redis): the
engine answers as transformers' own generate does, a cached answer equals the cold one (logits
within 1e-4), a full hit computes one token, a batch answers as each request alone; families
whose layers are not all full attention are refused at start-up, naming the reason."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.model.fetch import ModelError
from engine.model.loading import load_model
from engine.worker import Engine
from tests.helpers import FAMILIES, build_tiny_model, prefill_prompt, random_tokens, run_engine

NATIVE = {"llama", "mistral", "qwen2", "qwen3", "phi3"}
"""Families the native decode step runs (and the lean one, without it); the others decode through
transformers' forward."""


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp(request.param), family=request.param)
    return request.param, path, load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))


def test_a_family_answers_as_transformers_and_cached_as_cold(family, make_cache) -> None:
    """Greedy tokens equal transformers' generate; with 2 of 3 blocks cached, the same tokens and
    first logits within 1e-4; an exact repeat of 384 tokens reuses 383 and computes one."""
    name, path, loaded = family
    prompt = tuple(random_tokens(300, seed=7))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()

    cached, cold = Engine(loaded, make_cache(loaded)), Engine(loaded, None)
    try:
        assert cached.decoder.name == ("native" if name in NATIVE else "transformers")
        tokens, _cached_tokens, _ = run_engine(cold, prompt)
        assert tokens == expected[: len(tokens)] and len(tokens) == 12

        run_engine(cached, prompt[:256], max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(30)
        warm_logits, reused, fed = prefill_prompt(cached, prompt)
        cold_logits, _, _ = prefill_prompt(cold, prompt)
        assert (reused, fed) == (256, 300)
        assert torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
        assert run_engine(cached, prompt) == (tokens, 256, "length")

        repeat = tuple(random_tokens(384, seed=8))
        run_engine(cached, repeat, max_tokens=1)
        assert cached.cache.flush(30)
        _, reused, fed = prefill_prompt(cached, repeat)
        assert (reused, fed) == (383, 384)
    finally:
        cached.close()
        cold.close()


def test_a_batch_answers_as_each_request_alone(family) -> None:
    """Three prompts of different lengths decoded together equal each decoded alone."""
    _, _, loaded = family
    engine = Engine(loaded, None, max_batch=3)
    try:
        prompts = [tuple(random_tokens(n, seed=n)) for n in (40, 130, 260)]
        alone = [run_engine(engine, p, max_tokens=10)[0] for p in prompts]
        with ThreadPoolExecutor(3) as pool:
            together = list(pool.map(lambda p: run_engine(engine, p, max_tokens=10)[0], prompts))
        assert together == alone
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("name", "changes", "reason"),
    [
        (
            "gemma2",
            {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64},
            "sliding_attention",
        ),
        ("mistral", {"sliding_window": 64}, "sliding window of 64 tokens"),
    ],
)
def test_layers_that_are_not_full_attention_are_refused(tmp_path, name, changes, reason) -> None:
    """A sliding-window layer keeps only part of the past: refused at start-up, with the reason."""
    path = build_tiny_model(tmp_path / name, family=name, **changes)
    with pytest.raises(ModelError, match=reason):
        load_model(str(path), cache_dir=tmp_path)


@pytest.mark.parametrize(("dtype", "native"), [("bfloat16", True), ("float32", False)])
def test_the_lean_step_keeps_the_promise(tmp_path, make_cache, dtype, native) -> None:
    """Where the native step cannot run (bfloat16 weights; no compiler, as if none were found),
    the lean step is used (it agrees with transformers on the model), and a prompt on 2 cached
    blocks answers with the cold greedy tokens."""
    path = build_tiny_model(tmp_path / "llama")
    loaded = load_model(str(path), cache_dir=tmp_path, dtype=dtype)
    if not native:
        loaded = dataclasses.replace(loaded, kernels=None)
    assert (loaded.kv_spec.dtype, loaded.weights) == (dtype, "full")
    cached, cold = Engine(loaded, make_cache(loaded)), Engine(loaded, None)
    try:
        assert cached.decoder.name == "lean"
        prompt = tuple(random_tokens(300, seed=9))
        run_engine(cached, prompt[:256], max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(30)
        warm, cached_tokens, _ = run_engine(cached, prompt, max_tokens=16)
        assert cached_tokens == 256 and warm == run_engine(cold, prompt, max_tokens=16)[0]
    finally:
        cached.close()
        cold.close()
