"""``Sequence``: one request inside the engine, from admission to its last token.

Ranges of one request (n prompt tokens, k leading blocks cached and verified, g generated)::

    prompt_ids                                                  generated
    |<-- reused r = min(128k, n-1) + t -->|<-- prefilled -->|<--- decoded --->|
    0                                     r                 n             n+g-1 (the last token
    saved after prefill:  blocks [k, n // 128), then the tail [128 (n // 128), n)   is fed as the
    saved at the end:     blocks [n // 128, (n + g) // 128), then the tail up to n + g   answer ends)

r is ``hashing.reusable_tokens(n, k)`` plus the t tokens a tail served (``hashing.tails``; the
lookup takes at most n - 1 - 128k of them): the last prompt token is always computed, since its
logits are what the first token is sampled from, and no token is ever fed twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import NamedTuple

import torch
from transformers import DynamicCache

from engine.audit import AuditCapture
from engine.constraint import Constraint
from engine.drafting import Drafter
from engine.requests import GenerationRequest, PrefillDone, RequestHandle
from engine.sampling import Sampler
from engine.text import TextStream
from hashing import BlockHash, Namespace
from store.outcomes import MissReason


class State(Enum):
    """Where a sequence is: each state is one queue of the scheduler."""

    WAITING = auto()  # queued, not admitted
    LOADING = auto()  # admitted; its cached prefix is being looked up (off the model thread)
    PREFILLING = auto()  # its past is ready; prompt chunks take turns with other requests
    DECODING = auto()  # one token per step, batched with the others
    FINISHED = auto()


class LoadedPrefix(NamedTuple):
    """A prompt's past as far as the cache served it (the lookup stage's outcome)."""

    past: DynamicCache  # K/V of positions [0, cached_tokens); the sequence grows it in place
    cached_tokens: int  # r in the diagram above
    cached_blocks: int  # k
    miss_reason: MissReason | None
    tail_tokens: int = 0  # of cached_tokens, served by a tail (``hashing.tails``)
    tail_hash: BlockHash | None = None  # that tail's
    continuation: tuple[int, ...] = ()  # tokens a cached tail holds past the prompt (drafts only)


@dataclass(eq=False)
class Sequence:
    """One request's state in the engine (owned by the engine's threads).

    Attributes:
        namespace: the cache namespace of the request's tenant (``LoadedModel.namespace``).
        prefix: what the lookup stage served (None until it ran, or when it failed: ``error``).
    """

    request: GenerationRequest
    handle: RequestHandle
    sampler: Sampler
    text: TextStream
    namespace: Namespace
    state: State = State.WAITING
    admitted: float = 0.0  # time.perf_counter() at admission
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    prefix: LoadedPrefix | None = None
    load_s: float = 0.0
    chunks: Iterator[torch.Tensor] | None = None  # the prefill's steps, made on the model thread
    generated: list[int] = field(default_factory=list)
    error: BaseException | None = None  # the lookup stage failed
    audit: AuditCapture | None = None  # a hit sampled for the fidelity audit
    constraint: Constraint | None = None  # the request's grammar, if it has one
    drafter: Drafter | None = None  # its speculation's drafts (None: decoding without)

    @property
    def n(self) -> int:
        """Prompt tokens."""
        return len(self.request.prompt_ids)

    @property
    def past(self) -> DynamicCache | None:
        """K/V of every fed position (the loaded prefix's past, grown), None before the lookup."""
        return None if self.prefix is None else self.prefix.past

    @property
    def fed(self) -> int:
        """Positions whose K/V are in the past (prompt, then every generated token but the last)."""
        return 0 if self.past is None else self.past.get_seq_length()

    @property
    def cancelled(self) -> bool:
        return self.handle.cancelled

    def admit(self) -> None:
        self.state, self.admitted = State.LOADING, time.perf_counter()

    def prefill_done(self) -> PrefillDone:
        """The event of its prompt computed (its prefix loaded): now is the prefill's end."""
        assert self.prefix is not None, "the lookup stage has not run"
        return PrefillDone(
            prompt_tokens=self.n,
            cached_tokens=self.prefix.cached_tokens,
            cached_blocks=self.prefix.cached_blocks,
            miss_reason=self.prefix.miss_reason,
            load_s=self.load_s,
            prefill_s=time.perf_counter() - self.admitted,
            tail_tokens=self.prefix.tail_tokens,
        )
