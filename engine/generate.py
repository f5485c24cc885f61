"""Generation stages: ``prefill`` a suffix on a past, ``decode_step`` one token, ``Sampler``.

Positions are the single source of truth: the token at absolute position p is fed with
``cache_position = position_ids = p``, whether its past came from the cache or from this request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

PREFILL_CHUNK_TOKENS = 256
"""Prefill in chunks of this many tokens, so a cancelled request stops between chunks (a chunk
takes about half a second for the default model on 2 CPU cores)."""


class Cancelled(Exception):
    """The request was cancelled (its client went away) during prefill."""


@torch.inference_mode()
def prefill_chunks(
    model: Any, suffix_ids: Sequence[int], past: DynamicCache, start_pos: int
) -> Iterator[torch.Tensor]:
    """Feed ``suffix_ids`` at positions ``start_pos ..`` on top of ``past`` (grown in place), one
    chunk of ``PREFILL_CHUNK_TOKENS`` per iteration.

    Args:
        suffix_ids: at least one token id.
        past: K/V of positions ``[0, start_pos)``.

    Yields:
        After each chunk, the logits of its last position, ``[vocab_size]`` float32; the last
        yield is the prompt's next-token distribution.
    """
    assert len(suffix_ids) > 0 and past.get_seq_length() == start_pos
    for offset in range(0, len(suffix_ids), PREFILL_CHUNK_TOKENS):
        chunk = suffix_ids[offset : offset + PREFILL_CHUNK_TOKENS]
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


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI sampling parameters. ``temperature`` 0 means greedy (argmax).

    Penalties follow OpenAI's definition: a token's logit is lowered by ``frequency_penalty`` times
    how often it was generated so far, plus ``presence_penalty`` once it was generated at all.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)


class Sampler:
    """Draws next tokens; reproducible for a given ``seed``."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed is not None:
            # NOTE: OpenAI accepts any integer seed; torch takes 64 bits.
            self.generator.manual_seed(params.seed % 2**64)
        else:
            self.generator.seed()
        self.counts: torch.Tensor | None = None  # [vocab_size] times each token was generated

    def __call__(self, logits: torch.Tensor) -> int:
        """Next token id from ``logits`` ``[vocab_size]`` (bias and penalties applied to a copy)."""
        if self.params.logit_bias:
            ids, values = zip(*self.params.logit_bias, strict=True)
            logits = logits.index_add(0, torch.tensor(ids), torch.tensor(values, dtype=logits.dtype))
        if self.params.presence_penalty or self.params.frequency_penalty:
            if self.counts is None:
                self.counts = torch.zeros_like(logits)
            logits = logits - self.params.frequency_penalty * self.counts
            logits = logits - self.params.presence_penalty * (self.counts > 0).to(logits.dtype)
            token = self._draw(logits)
            self.counts[token] += 1
            return token
        return self._draw(logits)

    def _draw(self, logits: torch.Tensor) -> int:
        if self.params.temperature <= 1e-5:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # keep the smallest set whose mass reaches top_p (always at least one token)
            drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= self.params.top_p
            drop[0] = False  # NOTE: a top_p that rounds to 0 in float32 still keeps the best token
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self.generator))
