"""What each layer of a model attends to, read from its configuration: the whole past, or a sliding
window of the last W positions; and the layers kvproxy cannot serve from cached blocks.

A block stores the K/V of every position of every layer, and the K/V a layer computes at a
position does not depend on how later positions look at it: a window is a mask on attention, not
a change to the K/V. So a sliding-window layer is served like a full one, with the whole past
kept and the window applied where it attends (transformers' mask in prefill, the decode steps'
own slicing), and every block stays valid for every layer. Recurrent and state-space layers are
different: their state after a position sums the whole past, and is not a per-position K/V.

The window rule is transformers' (``masking_utils.sliding_window_overlay``): the query at position
p attends positions ``k`` with ``p - W < k <= p``, the last W positions including its own.
"""

from __future__ import annotations

from typing import Any

from engine.model.fetch import ModelError

ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention"})
"""``config.layer_types`` entries served from cached blocks."""

_NEEDS = {
    "chunked_attention": "a chunk mask (attention restarting every chunk) in the decode steps",
}
"""What serving a layer kind would need, where it is not recurrent (the default explanation)."""


def layer_windows(config: Any) -> tuple[int | None, ...]:
    """The attention window of each layer in tokens, or None where the layer attends to the whole
    past (also for a window of at least ``max_position_embeddings``, or one switched off).

    Layers follow ``config.layer_types`` where given (``"sliding_attention"`` ones get
    ``config.sliding_window``, as in transformers' Gemma 2/3, Qwen2/3 and Ministral code), else
    ``config.sliding_window`` applies to every layer (Mistral, Phi-3).

    Raises:
        ModelError: a layer kind other than full or sliding attention (``refusal``).
    """
    if (reason := refusal(config)) is not None:
        raise ModelError(reason)
    count = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    if (
        not window
        or getattr(config, "use_sliding_window", True) is False
        or window >= getattr(config, "max_position_embeddings", window + 1)
    ):
        return (None,) * count
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * count
    return tuple(int(window) if kind == "sliding_attention" else None for kind in types)


def describe(windows: tuple[int | None, ...]) -> str:
    """E.g. ``"30 layers, full attention"`` or ``"26 layers: 22 with a 512-token sliding window,
    4 full attention"``."""
    sliding = sorted({w for w in windows if w is not None})
    if not sliding:
        return f"{len(windows)} layers, full attention"
    if len(sliding) == 1 and None not in windows:
        return f"{len(windows)} layers, each with a {sliding[0]}-token sliding window"
    parts = [f"{windows.count(w)} with a {w}-token sliding window" for w in sliding]
    if full := windows.count(None):
        parts.append(f"{full} full attention")
    return f"{len(windows)} layers: {', '.join(parts)}"


def refusal(config: Any) -> str | None:
    """Why kvproxy cannot serve ``config``'s model from cached blocks, naming the layers and what
    serving them would need; None when every layer is full or sliding-window attention.

    Read from ``layer_types`` (e.g. ``linear_attention``, ``mamba``, ``conv``) and, for families
    without it, from the state-space fields transformers' configurations carry.
    """
    name = getattr(config, "model_type", "this model")
    if getattr(config, "is_encoder_decoder", False):
        return f"{name} is an encoder-decoder model; kvproxy serves decoder-only models"
    types = [
        str(kind)
        for kind in getattr(config, "layer_types", None)
        or getattr(config, "layers_block_type", None)  # Jamba
        or getattr(config, "block_types", None)  # RecurrentGemma
        or []
    ]
    if not types and any(hasattr(config, f) for f in ("state_size", "ssm_state_size", "mamba_d_state")):
        types = ["state-space"] * int(getattr(config, "num_hidden_layers", 1) or 1)
    other = sorted({kind for kind in types if kind not in ATTENTION_KINDS | {"attention"}})
    if not other:
        return None
    named = "; ".join(
        f"{kind} (layers {_spans([i for i, k in enumerate(types) if k == kind])})" for kind in other
    )
    needs = {
        _NEEDS.get(
            kind,
            "the layer's recurrent state saved at every block boundary and restored with the blocks "
            "(its state after a position sums the whole past; it has no per-position K/V to cache)",
        )
        for kind in other
    }
    return (
        f"{name} has layers kvproxy cannot serve from cached blocks: {named}. Serving them would "
        f"need {'; and '.join(sorted(needs))}. kvproxy serves models whose layers are full or "
        "sliding-window attention"
    )


def _spans(indices: list[int]) -> str:
    """``[0, 1, 2, 4]`` -> ``"0-2, 4"``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
