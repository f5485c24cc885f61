"""What a sequence hands to the cache: its new full blocks and a tail, copied out of its past.

Called on the model thread as a sequence's prompt is computed (its blocks and tail, and a tail at
each of its ``boundaries``) and once it ends (the blocks and tail its completion completed, and a
tail inside each of those blocks: ``Storer.answer``); the copies are fresh host tensors, and the
cache stores them in the background (``PrefixCache.save``, ``PrefixCache.save_tail``).
"""

from __future__ import annotations

from engine.kv import blocks_from_past, tail_from_past
from engine.sequence import Sequence
from hashing import BLOCK_SIZE, num_full_blocks
from store.interface import PrefixCache


class Storer:
    """Hands sequences' K/V to ``cache`` (None: ``--no-cache``, nothing is stored)."""

    def __init__(self, cache: PrefixCache | None) -> None:
        self.cache = cache

    def store(self, seq: Sequence, token_ids: tuple[int, ...], first_block: int, end: int) -> None:
        """Blocks ``[first_block, end // 128)`` of ``token_ids`` (fed, so in the past), then the
        tail up to position ``end``."""
        self.blocks(seq, token_ids, first_block, num_full_blocks(end))
        self.tail(seq, token_ids, end)

    def answer(self, seq: Sequence, token_ids: tuple[int, ...], end: int) -> None:
        """What a finished completion completed (``token_ids``: prompt and completion, fed up to
        ``end``): its blocks and tail (``store``), and for each block it completed, a tail of that
        block's first 127 tokens.

        NOTE: a history renders a generated answer again, and may tokenize it otherwise (a tool
        call sampled token by token under a grammar: ``}`` ``}`` sampled, ``}}`` rendered); the
        next prompt then leaves the answer's chain inside a block, whose hash no longer matches.
        A tail serves its longest common prefix with a prompt (``hashing.shared_tokens``), so
        these tails reuse the answer up to the first token that differs wherever that is. A
        prompt's own blocks need none: rendered again, they come out the same.
        """
        first, done = num_full_blocks(seq.n), num_full_blocks(end)
        self.store(seq, token_ids, first, end)
        for block in range(first, done):
            if (block + 1) * BLOCK_SIZE - 1 > seq.n:  # NOTE: else the prompt's own tail
                self.tail(seq, token_ids, (block + 1) * BLOCK_SIZE - 1)

    def tail(self, seq: Sequence, token_ids: tuple[int, ...], end: int) -> None:
        """The tail of ``token_ids[:end]`` (``hashing.tails``), if it has one."""
        start = num_full_blocks(end) * BLOCK_SIZE
        if self.cache is None or end == start:
            return
        assert seq.past is not None
        key, value = tail_from_past(seq.past, start, end)
        self.cache.save_tail(seq.namespace, token_ids[:end], key, value, seq.request.cache_ttl_s)

    def blocks(self, seq: Sequence, token_ids: tuple[int, ...], first_block: int, end_block: int) -> None:
        """Blocks ``[first_block, end_block)`` of ``token_ids``."""
        if self.cache is None or end_block <= first_block:
            return
        assert seq.past is not None
        key, value = blocks_from_past(seq.past, first_block, end_block)
        ids = token_ids[: end_block * BLOCK_SIZE]
        self.cache.save(seq.namespace, ids, first_block, key, value, seq.request.cache_ttl_s)
