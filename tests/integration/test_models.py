"""Model loading: missing or unsupported models fail at start-up with a message saying what to do."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from engine.fetch import ModelError
from engine.loading import load_model


def test_missing_model_path_exits_with_advice(tmp_path) -> None:
    """`kvproxy serve --model <missing>` exits 1 and names the accepted forms."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--model",
            str(tmp_path / "nope"),
            "--cache-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "not found" in result.stderr and "--model" in result.stderr


def test_directory_without_weights_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"config\.json and \*\.safetensors"):
        load_model(str(tmp_path), cache_dir=tmp_path)


def test_sliding_window_model_is_refused(tmp_path, tiny_model) -> None:
    """A model with sliding-window attention cannot be rebuilt from blocks: refused at load."""
    config = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=16,
    )
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    tiny_model.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="full attention"):
        load_model(str(tmp_path), cache_dir=tmp_path)


def test_unknown_dtype_is_refused(tmp_path) -> None:
    with pytest.raises(ModelError, match="dtype"):
        load_model("smollm2-135m-instruct", cache_dir=tmp_path, dtype="int3")
