"""KV layout: cut a model's cache into blocks, and build a model's cache from blocks.

Blocks are ``[num_layers, num_kv_heads, 128, head_dim]``; the model's cache (transformers'
``DynamicCache``) holds per layer ``[batch=1, num_kv_heads, seq_len, head_dim]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from hashing import BLOCK_SIZE
from store.interface import KVBlock


def past_from_blocks(blocks: Sequence[KVBlock], num_tokens: int) -> DynamicCache:
    """A cache holding the K/V of the first ``num_tokens`` tokens of ``blocks``.

    Args:
        blocks: leading blocks of a prompt, in chain order.
        num_tokens: at most ``128 * len(blocks)``; fewer when the last block is used only in
            part (a fully cached prompt reuses 127 tokens of its last block).

    Returns:
        A ``DynamicCache`` of ``num_tokens`` positions (empty when ``num_tokens`` is 0).
    """
    assert 0 <= num_tokens <= BLOCK_SIZE * len(blocks), (num_tokens, len(blocks))
    past = DynamicCache()
    if num_tokens == 0:
        return past
    layers, heads, _, dim = blocks[0].key.shape
    # NOTE: one copy: every block's K/V goes straight into its place in one tensor per K and V,
    # and each layer of the cache is a view of it (the model's next update concatenates anyway).
    key = blocks[0].key.new_empty((layers, 1, heads, num_tokens, dim))
    value = blocks[0].value.new_empty((layers, 1, heads, num_tokens, dim))
    for i, block in enumerate(blocks):
        span = slice(i * BLOCK_SIZE, min((i + 1) * BLOCK_SIZE, num_tokens))
        if span.start >= span.stop:
            break
        key[:, 0, :, span] = block.key[:, :, : span.stop - span.start]
        value[:, 0, :, span] = block.value[:, :, : span.stop - span.start]
    for i in range(layers):
        layer = DynamicLayer()
        layer.lazy_initialization(key[i], value[i])
        layer.keys, layer.values = key[i], value[i]
        past.layers.append(layer)
    return past


def blocks_from_past(
    past: DynamicCache, first_block: int, end_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the K/V of blocks ``[first_block, end_block)`` out of a cache.

    Returns:
        ``(key, value)``, each ``[num_layers, num_kv_heads, 128 * (end_block - first_block),
        head_dim]``: fresh tensors, safe to hand to a background writer.
    """
    span = slice(first_block * BLOCK_SIZE, end_block * BLOCK_SIZE)
    assert past.get_seq_length() >= span.stop, (past.get_seq_length(), span)
    key = torch.stack([layer.keys[0, :, span] for layer in past.layers])
    value = torch.stack([layer.values[0, :, span] for layer in past.layers])
    return key, value
