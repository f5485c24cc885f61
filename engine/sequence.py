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

import torch
from transformers import DynamicCache

from engine.audit import AuditCapture
from engine.constraint import Constraint
from engine.requests import GenerationRequest, RequestHandle
from engine.sampling import Sampler
from engine.text import TextStream
from hashing import BlockHash
from store.outcomes import MissReason


class State(Enum):
    """Where a sequence is: each state is one queue of the scheduler."""

    WAITING = auto()  # queued, not admitted
    LOADING = auto()  # admitted; its cached prefix is being looked up (off the model thread)
    PREFILLING = auto()  # its past is ready; prompt chunks take turns with other requests
    DECODING = auto()  # one token per step, batched with the others
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    """One request's state in the engine (owned by the engine's threads)."""

    request: GenerationRequest
    handle: RequestHandle
    sampler: Sampler
    text: TextStream
    state: State = State.WAITING
    admitted: float = 0.0  # time.perf_counter() at admission
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    past: DynamicCache | None = None  # K/V of every fed position
    cached_tokens: int = 0  # r in the diagram above
    cached_blocks: int = 0  # k
    tail_tokens: int = 0  # of cached_tokens, served by a tail
    tail_hash: BlockHash | None = None  # that tail's
    miss_reason: MissReason | None = None
    load_s: float = 0.0
    chunks: Iterator[torch.Tensor] | None = None  # the prefill's steps, made on the model thread
    generated: list[int] = field(default_factory=list)
    error: BaseException | None = None  # the lookup stage failed
    audit: AuditCapture | None = None  # a hit sampled for the fidelity audit
    constraint: Constraint | None = None  # the request's grammar, if it has one

    @property
    def n(self) -> int:
        """Prompt tokens."""
        return len(self.request.prompt_ids)

    @property
    def fed(self) -> int:
        """Positions whose K/V are in the past (prompt, then every generated token but the last)."""
        return 0 if self.past is None else self.past.get_seq_length()

    @property
    def cancelled(self) -> bool:
        return self.handle.cancelled

    def admit(self) -> None:
        self.state, self.admitted = State.LOADING, time.perf_counter()
