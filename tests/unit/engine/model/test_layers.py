"""Each layer's attention window, read from transformers' own configurations of the families, and
the layers refused (recurrent, state-space, chunked), named in the refusal."""

from __future__ import annotations

import pytest
from transformers import (
    FalconH1Config,
    Gemma2Config,
    Gemma3TextConfig,
    JambaConfig,
    Llama4TextConfig,
    LlamaConfig,
    MambaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3NextConfig,
)

from engine.model.fetch import ModelError
from engine.model.layers import describe, layer_windows, refusal


def test_windows_follow_the_config() -> None:
    """A family-wide window (Mistral, Phi-3), per-layer types (Gemma 3, Qwen2's
    max_window_layers), and windows that are off or cover the whole context."""
    assert layer_windows(MistralConfig(num_hidden_layers=2, max_position_embeddings=32768)) == (4096, 4096)
    assert layer_windows(Phi3Config(num_hidden_layers=2, sliding_window=2047)) == (2047, 2047)
    gemma3 = Gemma3TextConfig(num_hidden_layers=6, sliding_window=512)
    assert layer_windows(gemma3) == (512,) * 5 + (None,)
    qwen2 = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=2)
    assert layer_windows(qwen2) == (None, None, 64, 64)
    assert layer_windows(Qwen2Config(num_hidden_layers=2)) == (None, None)  # use_sliding_window off
    assert layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=None)) == (None, None)
    assert layer_windows(
        Phi3Config(num_hidden_layers=2, sliding_window=8192, max_position_embeddings=4096)
    ) == (
        None,
        None,
    )
    gemma2 = Gemma2Config(num_hidden_layers=4, sliding_window=64)
    assert layer_windows(gemma2) == (64, None, 64, None)


def test_describe_says_what_each_layer_reads() -> None:
    assert describe((None, None)) == "2 layers, full attention"
    assert describe((64, 64)) == "2 layers, each with a 64-token sliding window"
    assert describe((512,) * 5 + (None,)) == "6 layers: 5 with a 512-token sliding window, 1 full attention"


def test_attention_families_are_not_refused() -> None:
    for config in (LlamaConfig(), MistralConfig(), Gemma3TextConfig(), Gemma2Config(), Phi3Config()):
        assert refusal(config) is None


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (Qwen3NextConfig(num_hidden_layers=8), "linear_attention (layers 0-2, 4-6)"),
        (MambaConfig(num_hidden_layers=3), "(layers 0-2)"),
        (JambaConfig(num_hidden_layers=8), "(layers 0-3, 5-7)"),
        (FalconH1Config(num_hidden_layers=2), "hybrid (layers 0-1)"),
    ],
)
def test_recurrent_layers_are_named_with_what_they_would_need(config, named) -> None:
    reason = refusal(config)
    assert reason is not None and named in reason and "state saved at every block boundary" in reason
    with pytest.raises(ModelError, match="cannot serve from cached blocks"):
        layer_windows(config)


def test_chunked_attention_is_refused_with_its_own_need() -> None:
    reason = refusal(Llama4TextConfig(num_hidden_layers=4))
    assert reason is not None and "chunked_attention (layers 0-2)" in reason and "chunk mask" in reason
