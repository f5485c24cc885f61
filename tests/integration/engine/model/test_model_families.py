"""Every model family kvproxy claims, on a tiny random configuration (float32, real Redis), with
full-attention layers and with sliding windows shorter than the prompts: the engine answers as
transformers' own generate does, a cached answer equals the cold one (logits within 1e-4; for a
window, at block boundaries too), a full hit computes one token, a batch answers as each request
alone; families with recurrent or state-space layers are refused at start-up, naming them."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from openai import OpenAI
from transformers import (
    AutoModelForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from engine.buffers import BufferPool
from engine.decoding import TransformersDecoder
from engine.forward import prefill, use_batched_attention
from engine.kv import past_from_blocks
from engine.model.fetch import ModelError
from engine.model.loading import load_model
from engine.worker import Engine
from tests.helpers import FAMILIES, HANG_S, build_tiny_model, prefill_prompt, random_tokens, run_engine

NATIVE = {"llama", "mistral", "qwen2", "qwen3", "phi3"}
"""Families the native decode step runs (and the lean one, without it), with or without windows;
the lean step runs the others (Gemma's soft-capping, extra norms, per-layer rotary bases)."""


def _load(name, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp(name), family=name)
    return name, path, load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    return _load(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(f for f in FAMILIES if f.endswith("-window")))
def windowed(request, tmp_path_factory):
    return _load(request.param, tmp_path_factory)


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
        assert cached.decoder.name == ("native" if name.removesuffix("-window") in NATIVE else "lean")
        tokens, _cached_tokens, _ = run_engine(cold, prompt)
        assert tokens == expected[: len(tokens)] and len(tokens) == 12

        run_engine(cached, prompt[:256], max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(HANG_S)
        warm_logits, reused, fed = prefill_prompt(cached, prompt)
        cold_logits, _, _ = prefill_prompt(cold, prompt)
        assert (reused, fed) == (256, 300)
        assert torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
        assert run_engine(cached, prompt) == (tokens, 256, "length")

        repeat = tuple(random_tokens(384, seed=8))
        run_engine(cached, repeat, max_tokens=1)
        assert cached.cache.flush(HANG_S)
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


@pytest.mark.parametrize("length", [129, 256, 257, 383])
def test_a_window_is_kept_at_block_boundaries(windowed, make_cache, length) -> None:
    """With sliding-window layers, a prompt that ends at, just past or just before a block
    boundary answers from its cached blocks as it does cold (the window reaches back into them)."""
    _, _, loaded = windowed
    prompt = tuple(random_tokens(length, seed=length))
    cached, cold = Engine(loaded, make_cache(loaded)), Engine(loaded, None)
    try:
        run_engine(cached, prompt, max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(HANG_S)
        warm = run_engine(cached, prompt, max_tokens=8)
        assert warm[1] in (length // 128 * 128, length - 1)  # its blocks, or its blocks and tail
        assert warm[0] == run_engine(cold, prompt, max_tokens=8)[0]
    finally:
        cached.close()
        cold.close()


def test_transformers_batched_step_keeps_the_window(windowed) -> None:
    """transformers' forward as the decode step (for models neither native nor lean runs): rows
    decoded together, each past longer than the window, get the logits each gets alone."""
    _, _, loaded = windowed
    use_batched_attention(loaded.model)
    step = TransformersDecoder(loaded.model)
    spec = loaded.kv_spec
    pool = BufferPool(torch.empty(spec.num_layers, spec.num_kv_heads, 0, spec.head_dim), keep=0)
    prompts = [random_tokens(n, seed=n) for n in (60, 130)]
    pasts = [past_from_blocks([], 0, pool.acquire(200)) for _ in prompts]
    alone_pasts = [past_from_blocks([], 0, pool.acquire(200)) for _ in prompts]
    with torch.inference_mode():
        for prompt, past, alone in zip(prompts, pasts, alone_pasts, strict=True):
            prefill(loaded.model, prompt, past, 0)
            prefill(loaded.model, prompt, alone, 0)
        together = step([5, 6], pasts, [60, 130])
        apart = torch.cat([step([5], [alone_pasts[0]], [60]), step([6], [alone_pasts[1]], [130])])
    assert (together - apart).abs().max() <= 1e-5 * apart.abs().max()


_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (
            lambda: (
                Qwen3NextConfig(
                    **_SHAPE,
                    vocab_size=400,
                    num_hidden_layers=2,
                    layer_types=["linear_attention", "full_attention"],
                ),
                Qwen3NextForCausalLM,
            ),
            "linear_attention (layers 0)",
        ),
        (
            lambda: (MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=400), MambaForCausalLM),
            "layers 0-1",
        ),
    ],
)
def test_recurrent_layers_are_refused_by_name(tmp_path, make, named) -> None:
    """A recurrent or state-space layer has no per-position K/V: refused at start-up, before the
    weights load, naming the layers and what serving them would need."""
    config, model_class = make()
    path = tmp_path / config.model_type
    model_class(config).save_pretrained(path)
    with pytest.raises(ModelError, match="cannot serve from cached blocks") as refused:
        load_model(str(path), cache_dir=tmp_path)
    assert named in str(refused.value) and "state saved at every block boundary" in str(refused.value)


@pytest.mark.parametrize(
    ("name", "dtype", "native"),
    [
        ("llama", "bfloat16", True),
        ("llama", "float32", False),
        ("mistral-window", "float32", False),
        ("qwen2-window", "bfloat16", True),
    ],
)
def test_the_lean_step_keeps_the_promise(tmp_path, make_cache, name, dtype, native) -> None:
    """Where the native step cannot run (bfloat16 weights; no compiler, as if none were found),
    the lean step is used (it agrees with transformers on the model, across a sliding window
    too), and a prompt on 2 cached blocks answers with the cold greedy tokens."""
    path = build_tiny_model(tmp_path / name, family=name)
    loaded = load_model(str(path), cache_dir=tmp_path, dtype=dtype)
    if not native:
        loaded = dataclasses.replace(loaded, kernels=None)
    assert (loaded.kv_spec.dtype, loaded.weights) == (dtype, "full")
    cached, cold = Engine(loaded, make_cache(loaded)), Engine(loaded, None)
    try:
        assert cached.decoder.name == "lean"
        prompt = tuple(random_tokens(300, seed=9))
        run_engine(cached, prompt[:256], max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(HANG_S)
        warm, cached_tokens, _ = run_engine(cached, prompt, max_tokens=16)
        assert cached_tokens == 256 and warm == run_engine(cold, prompt, max_tokens=16)[0]
    finally:
        cached.close()
        cold.close()


def test_a_windowed_model_over_http(tmp_path, settings, serve) -> None:
    """Gemma 3 with interleaved sliding-window layers, served: the official client's repeated chat
    answers from its cached blocks as it did cold, and ``/health`` says what the layers attend to."""
    path = build_tiny_model(tmp_path / "gemma3-window", family="gemma3-window")
    loaded = load_model(str(path), cache_dir=tmp_path)
    document = " ".join(f"Clause {i}: the fox jumps over the dog." for i in range(40))
    messages = [{"role": "system", "content": document}, {"role": "user", "content": "What jumps?"}]
    with serve(settings, loaded) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        cold = client.chat.completions.create(
            model=loaded.name, messages=messages, max_tokens=12, temperature=0
        )
        assert server.app.state.engine.cache.flush(HANG_S)
        warm = client.chat.completions.create(
            model=loaded.name, messages=messages, max_tokens=12, temperature=0
        )
        health = httpx.get(f"{server.base_url}/health").json()
    assert cold.usage is not None and warm.usage is not None and cold.usage.prompt_tokens > 2 * 128
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens >= 2 * 128
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert health["attention"] == "3 layers: 2 with a 48-token sliding window, 1 full attention"
    assert health["format"].endswith("lean decode step")
