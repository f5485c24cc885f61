"""Sampling: OpenAI's sampling parameters, the ``Sampler`` that draws next tokens, log-probabilities.

Everything runs on the logits' own device (the generator too), so sampling never copies a
vocabulary-sized tensor between devices; only the chosen token id comes back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    """Draws next tokens from ``[vocab_size]`` logits; reproducible for a given ``seed``.

    Args:
        params: the request's sampling parameters.
        device: where the logits live (the model's device); the generator and the bias and
            penalty tensors live there too.
    """

    def __init__(self, params: SamplingParams, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.generator = torch.Generator(device=device)
        if params.seed is not None:
            # NOTE: OpenAI accepts any integer seed; torch takes 64 bits.
            self.generator.manual_seed(params.seed % 2**64)
        else:
            self.generator.seed()
        self.bias: tuple[torch.Tensor, torch.Tensor] | None = None
        if params.logit_bias:
            ids, values = zip(*params.logit_bias, strict=True)
            self.bias = torch.tensor(ids, device=device), torch.tensor(values, device=device)
        self.counts: torch.Tensor | None = None  # [vocab_size] times each token was generated

    def __call__(self, logits: torch.Tensor) -> int:
        """Next token id from ``logits`` ``[vocab_size]`` (bias and penalties applied to a copy)."""
        if self.bias is not None:
            ids, values = self.bias
            logits = logits.index_add(0, ids, values.to(logits.dtype))
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


def logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """Log-probability of ``token`` under ``logits`` ``[vocab_size]`` (before temperature) and the
    ``top`` most likely ``(token id, log-probability)`` pairs."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    if top <= 0:
        return float(log_probs[token]), ()
    best = torch.topk(log_probs, top)
    return float(log_probs[token]), tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True))
