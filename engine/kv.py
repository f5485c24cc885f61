"""KV layout: cut a model's cache into blocks, and build a model's cache from blocks.

Blocks are ``[num_layers, num_kv_heads, 128, head_dim]``; the model's cache (transformers'
``DynamicCache``) holds per layer ``[batch=1, num_kv_heads, seq_len, head_dim]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

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
    if num_tokens == 0:
        return DynamicCache()
    key = torch.cat([b.key for b in blocks], dim=2)[:, :, :num_tokens]
    value = torch.cat([b.value for b in blocks], dim=2)[:, :, :num_tokens]
    return DynamicCache(
        ddp_cache_data=[(key[i].unsqueeze(0), value[i].unsqueeze(0)) for i in range(key.shape[0])]
    )


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
