"""Batched decode: one forward pass feeds the next token of several sequences, each on its own
past of its own length.

The weights are read once per step for the whole batch (the linear layers see ``[batch, 1,
hidden]``), while attention runs per sequence on that sequence's own K/V, so no past is ever
padded or copied into a shared tensor. This works through transformers' attention interface:
the model is switched to the ``"kvproxy"`` attention implementation, which is transformers' SDPA
for ordinary calls and per-row SDPA when the cache hands it ``RowKV``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

ATTENTION = "kvproxy"


class RowKV(list[tuple[torch.Tensor, torch.Tensor]]):
    """Per-row ``(key, value)``, each ``[1, num_kv_heads, seq_len_of_row, head_dim]``."""


class RowsPast:
    """The past of a batch of sequences, as seen by one forward pass of the model.

    Args:
        pasts: one cache per row (grown in place by the forward pass).
    """

    def __init__(self, pasts: Sequence[DynamicCache]) -> None:
        self.pasts = pasts

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, **kwargs: object
    ) -> tuple[RowKV, RowKV]:
        """Append row b's new K/V ``[batch, num_kv_heads, 1, head_dim]`` to past b, layer
        ``layer_idx``; returns every row's whole K/V for the attention function."""
        rows = RowKV(
            past.layers[layer_idx].update(key_states[b : b + 1], value_states[b : b + 1])
            for b, past in enumerate(self.pasts)
        )
        return rows, rows


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor | RowKV,
    value: torch.Tensor | RowKV,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, or, for ``RowKV``, SDPA row by row (query ``[batch, heads,
    1, head_dim]``); returns ``[batch, q_len, heads, head_dim]``."""
    if not isinstance(key, RowKV):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    out = torch.cat(
        [
            F.scaled_dot_product_attention(query[b : b + 1], k, v, scale=scaling, enable_gqa=True)
            for b, (k, v) in enumerate(key)
        ]
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, _attention)
AttentionMaskInterface.register(ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_batched_attention(model: Any) -> None:
    """Switch ``model`` to the ``"kvproxy"`` attention (identical to SDPA for a single sequence)."""
    model.set_attn_implementation(ATTENTION)


@torch.inference_mode()
def decode_batch(
    model: Any, token_ids: Sequence[int], pasts: Sequence[DynamicCache], positions: Sequence[int]
) -> torch.Tensor:
    """Feed token ``token_ids[b]`` at position ``positions[b]`` on ``pasts[b]`` for every row b
    in one forward pass (each past grows by one position).

    Returns:
        Next-token logits ``[batch, vocab_size]`` float32.
    """
    device = next(model.parameters()).device
    batch = len(token_ids)
    out = model(
        input_ids=torch.tensor(token_ids, device=device).view(batch, 1),
        cache=RowsPast(pasts),
        position_ids=torch.tensor(positions, device=device).view(batch, 1),
        # NOTE: a ready 4-D mask makes transformers skip building one; rows need none (one query
        # token attends to its whole past).
        attention_mask=torch.ones((batch, 1, 1, 1), dtype=torch.bool, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1].float()
