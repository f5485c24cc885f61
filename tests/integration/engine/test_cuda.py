"""``--device cuda`` end to end, on the tiny model (skipped without a CUDA device): sampling,
``logit_bias`` and penalties on the GPU, blocks stored through pinned host memory and uploaded on a
hit, cached == uncached in float32 and bfloat16, and the OpenAI routes on a GPU server."""

from __future__ import annotations

import dataclasses
import logging

import httpx
import pytest
import torch

from engine.model.fetch import ModelError
from engine.model.loading import load_model
from engine.sampling import SamplingParams
from engine.worker import Engine
from proxy.config import Settings
from store.blobs.file import FileBlobStore
from store.cache import BlockCache
from store.index.memory.index import MemoryIndex
from store.parts import CacheOptions
from tests.helpers import (
    HANG_S,
    build_tiny_model,
    build_tiny_source_model,
    prefill_prompt,
    random_tokens,
    run_engine,
)

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-cuda"))


def on_gpu(checkpoint, tmp_path, dtype="float32"):
    loaded = load_model(str(checkpoint), cache_dir=tmp_path, dtype=dtype, device="cuda")
    cache = BlockCache(
        MemoryIndex(),
        FileBlobStore(tmp_path / "blobs"),
        loaded.kv_spec,
        CacheOptions(ttl_s=600, ram_bytes=1 << 26, pin_memory=True),
    )
    return loaded, Engine(loaded, cache), Engine(loaded, None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_equals_cold_on_the_gpu(checkpoint, tmp_path, dtype) -> None:
    """2 of 3 blocks cached: the cold greedy tokens (and in float32, first logits within 1e-4); the
    blocks reached the blob store (checksummed on the host) and come back pinned for upload."""
    loaded, cached, cold = on_gpu(checkpoint, tmp_path, dtype)
    try:
        assert loaded.device.type == "cuda" and (
            dtype == "float32" or loaded.kv_spec.dtype in ("bfloat16", "float16")
        )
        prompt = tuple(random_tokens(300, seed=3))
        run_engine(cached, prompt[:256], max_tokens=1)
        assert cached.cache is not None and cached.cache.flush(HANG_S)
        assert len(list((tmp_path / "blobs").rglob("*.safetensors"))) == 2
        warm, cached_tokens, _ = run_engine(cached, prompt, max_tokens=16)
        assert cached_tokens == 256 and warm == run_engine(cold, prompt, max_tokens=16)[0]
        if dtype == "float32":
            warm_logits, reused, _ = prefill_prompt(cached, prompt)
            cold_logits, _, _ = prefill_prompt(cold, prompt)
            assert reused == 256 and torch.allclose(warm_logits, cold_logits, atol=1e-4, rtol=0)
        blocks = cached.cache.lookup(loaded.namespace("default"), prompt).blocks
        assert blocks and all(b.key.device.type == "cpu" for b in blocks)
    finally:
        cached.close()
        cold.close()


def test_sampling_bias_and_penalties_run_on_the_gpu(checkpoint, tmp_path) -> None:
    """Temperature 1 with a seed repeats itself; a +100 bias forces a token; penalties run."""
    _, engine, _ = on_gpu(checkpoint, tmp_path)
    try:
        prompt = tuple(random_tokens(40, seed=4))
        seeded = SamplingParams(temperature=1.0, seed=11, presence_penalty=0.5, frequency_penalty=0.5)
        assert run_engine(engine, prompt, 12, seeded)[0] == run_engine(engine, prompt, 12, seeded)[0]
        forced = SamplingParams(temperature=1.0, logit_bias=((123, 100.0),))
        assert set(run_engine(engine, prompt, 8, forced)[0]) == {123}
    finally:
        engine.close()


def test_openai_routes_on_a_gpu_server(checkpoint, tmp_path, serve) -> None:
    """A GPU server (index in memory): a sampled request with logit_bias, then a hit."""
    loaded = load_model(str(checkpoint), cache_dir=tmp_path, device="cuda")
    settings = Settings(redis_url="memory://", blob_dir=tmp_path / "blobs", cache_dir=tmp_path, device="cuda")
    with serve(settings, dataclasses.replace(loaded, name="tiny")) as server:
        url = f"{server.base_url}/v1/completions"
        body = {"model": "tiny", "prompt": random_tokens(300, seed=5), "max_tokens": 8}
        first = httpx.post(url, json=body | {"temperature": 1, "logit_bias": {"7": 5}}, timeout=120)
        second = httpx.post(url, json=body | {"temperature": 0}, timeout=120)
    assert first.status_code == second.status_code == 200
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 256


def test_a_source_model_on_cuda_keeps_full_weights_and_says_so(tmp_path, caplog) -> None:
    """The source codes' kernels are CPU-only: on CUDA ``auto`` serves the float32 checkpoint
    (``full``) and logs why, and ``--weights source`` is refused naming the device."""
    source = build_tiny_source_model(tmp_path / "src")
    with caplog.at_level(logging.INFO, logger="engine.model.formats"):
        loaded = load_model(str(source), cache_dir=tmp_path, device="cuda")
    assert loaded.weights == "full" and loaded.device.type == "cuda"
    assert "weights: full (the source codes' kernels run on the CPU, not on cuda)" in caplog.text
    with pytest.raises(ModelError, match="run on the CPU, not on cuda"):
        load_model(str(source), cache_dir=tmp_path, device="cuda", weights="source")
