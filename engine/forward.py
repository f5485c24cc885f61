"""Forward passes: ``prefill`` a suffix on a past, ``decode_step`` one token, ``decode_batch`` the
next token of several sequences at once.

Positions are the single source of truth: the token at absolute position p is fed with
``cache_position = position_ids = p``, whether its past came from the cache or from this request.

Batched decode reads the weights once for the whole batch (the linear layers see ``[batch, 1,
hidden]``), while attention runs per sequence on that sequence's own K/V, so no past is ever
padded or copied into a shared tensor. This works through transformers' attention interface: the
model is switched to the ``"kvproxy"`` attention, which is transformers' SDPA for ordinary calls
and per-row SDPA (reading the K/V heads directly, grouped-query mode) when handed ``RowKV``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PREFILL_CHUNK_TOKENS = 256
"""Prefill in chunks of this many tokens, so other requests' decode steps run between chunks and
a cancelled request stops between them (a chunk takes about half a second for the default model
on 2 CPU cores)."""

ATTENTION = "kvproxy"


class Cancelled(Exception):
    """The request was cancelled (its client went away) during prefill."""


@torch.inference_mode()
def prefill_chunks(
    model: Any,
    suffix_ids: Sequence[int],
    past: DynamicCache,
    start_pos: int,
    chunk_tokens: int = PREFILL_CHUNK_TOKENS,
) -> Iterator[torch.Tensor]:
    """Feed ``suffix_ids`` at positions ``start_pos ..`` on top of ``past`` (grown in place), one
    chunk of ``chunk_tokens`` per iteration.

    Args:
        suffix_ids: at least one token id.
        past: K/V of positions ``[0, start_pos)``.

    Yields:
        After each chunk, the logits of its last position, ``[vocab_size]`` float32; the last
        yield is the prompt's next-token distribution.
    """
    assert len(suffix_ids) > 0 and past.get_seq_length() == start_pos
    for offset in range(0, len(suffix_ids), chunk_tokens):
        chunk = suffix_ids[offset : offset + chunk_tokens]
        yield _forward(model, chunk, past, start_pos + offset)


def prefill(
    model: Any,
    suffix_ids: Sequence[int],
    past: DynamicCache,
    start_pos: int,
    is_cancelled: Callable[[], bool] = lambda: False,
) -> torch.Tensor:
    """``prefill_chunks`` to the end: the logits ``[vocab_size]`` of the last prompt position.

    Raises:
        Cancelled: ``is_cancelled()`` turned true between chunks.
    """
    logits = None
    for chunk_logits in prefill_chunks(model, suffix_ids, past, start_pos):
        if is_cancelled():  # NOTE: also after the last chunk: a client that left gets nothing
            raise Cancelled
        logits = chunk_logits
    assert logits is not None
    return logits


@torch.inference_mode()
def decode_step(model: Any, token_id: int, past: DynamicCache, pos: int) -> torch.Tensor:
    """Feed one token at position ``pos``; returns the next-token logits ``[vocab_size]``."""
    return _forward(model, [token_id], past, pos)


def _forward(model: Any, ids: Sequence[int], past: DynamicCache, start: int) -> torch.Tensor:
    device = next(model.parameters()).device
    positions = torch.arange(start, start + len(ids), device=device)
    out = model(
        input_ids=torch.tensor([list(ids)], device=device),
        cache=past,
        cache_position=positions,
        position_ids=positions.unsqueeze(0),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[0, -1].float()


@torch.inference_mode()
def decode_batch(
    model: Any, token_ids: Sequence[int], pasts: Sequence[DynamicCache], positions: Sequence[int]
) -> torch.Tensor:
    """Feed token ``token_ids[b]`` at position ``positions[b]`` on ``pasts[b]`` for every row b
    in one forward pass (each past grows by one position); the model must use the batched
    attention (``use_batched_attention``).

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
        # token attends to its whole past, or to its window: ``_attention``).
        attention_mask=torch.ones((batch, 1, 1, 1), dtype=torch.bool, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1].float()


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
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, **_kwargs: object
    ) -> tuple[RowKV, RowKV]:
        """Append row b's new K/V ``[batch, num_kv_heads, 1, head_dim]`` to past b, layer
        ``layer_idx``; returns every row's whole K/V for the attention function."""
        rows = RowKV(
            cast(DynamicLayer, past.layers[layer_idx]).update(key_states[b : b + 1], value_states[b : b + 1])
            for b, past in enumerate(self.pasts)
        )
        return rows, rows


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor | RowKV,
    value: torch.Tensor | RowKV,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """The model's own attention implementation, or, for ``RowKV``, that implementation row by
    row (query ``[batch, heads, 1, head_dim]``, each row on its own K/V, or the last
    ``sliding_window`` positions of it, no mask); returns ``[batch, q_len, heads, head_dim]``."""
    base = _base_attention(module)
    if not isinstance(key, RowKV):
        assert not isinstance(value, RowKV)
        return base(module, query, key, value, attention_mask, **kwargs)
    # NOTE: a sliding-window layer (transformers passes its window) attends to the last W
    # positions of the row's past, its own included (engine.model.layers)
    window = kwargs.get("sliding_window")
    start = -window if window else None
    rows = [
        base(module, query[b : b + 1], k[:, :, start:], v[:, :, start:], None, **kwargs)[0]
        for b, (k, v) in enumerate(key)
    ]
    return torch.cat(rows), None


def _base_attention(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, Any]]:
    """The attention function the model used before ``use_batched_attention`` (``eager`` is the
    ``eager_attention_forward`` of the module's own modeling file)."""
    name = getattr(module.config, "kvproxy_base_attention", "sdpa")
    if name == "eager":
        return cast(
            Callable[..., tuple[torch.Tensor, Any]],
            importlib.import_module(type(module).__module__).eager_attention_forward,
        )
    return cast(Callable[..., tuple[torch.Tensor, Any]], ALL_ATTENTION_FUNCTIONS[name])


def use_batched_attention(model: Any) -> None:
    """Switch ``model`` to the ``"kvproxy"`` attention: the model's own implementation (SDPA, or
    eager where SDPA cannot do what the model needs, e.g. Gemma 2's logit soft-capping) for
    ordinary calls, row by row for a batched decode step."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != ATTENTION:
        # NOTE: a model whose modeling code cannot use SDPA (e.g. Gemma 2's soft-capping) loads
        # with "eager"; every attention call keeps using what the model was loaded with.
        base = config._attn_implementation or "sdpa"
        for sub in [
            config,
            *(getattr(config, name) for name in config.sub_configs if getattr(config, name, None)),
        ]:
            sub.kvproxy_base_attention = base
    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS[config.kvproxy_base_attention])
    model.set_attn_implementation(ATTENTION)
