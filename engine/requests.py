"""What goes into the engine and what comes out: a ``GenerationRequest``, then its events
(``PrefillDone``, ``TokenDelta``s, ``Finished`` or ``Failed``) handed to the caller's ``emit``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from engine.sampling import SamplingParams
from store.interface import TtlPlan
from store.outcomes import CacheKind, MissReason, cache_kind, first_miss

FinishReason = Literal["stop", "length", "cancelled"]


class EngineBusy(Exception):
    """The request queue is full; retry later."""


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to compute.

    Attributes:
        prompt_ids: the prompt as token ids (at least one).
        max_tokens: most tokens to generate (at least one).
        sampling: temperature / top_p / seed / penalties / bias.
        stop: strings that end the completion (excluded from its text).
        tenant: whose cache namespace to use (from the API key, never from the body).
        top_logprobs: how many most likely alternatives to report with each token.
        cache_ttl_s: TTLs of the blocks this request stores or hits (``store.interface.TtlPlan``:
            one for all, one per leading block, or None for the cache's default).
        prewarm: only compute and store the prompt's K/V: the prompt's blocks and tail are saved
            and the request ends (``Finished("length", 0)``) without sampling; it is counted apart
            (``EngineStats.prewarm_tokens``), never in the hit rates.
        boundaries: prompt positions (tokens) where later prompts may diverge, e.g. where the
            system prompt ends: the tail up to each is stored too (``hashing.tails``).
        grammar: an llguidance grammar the completion must follow (``engine.constraint``):
            only tokens it allows are sampled, and the completion ends where it is complete.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    tenant: str = "default"
    top_logprobs: int = 0
    cache_ttl_s: TtlPlan = None
    prewarm: bool = False
    boundaries: tuple[int, ...] = ()
    grammar: str | None = None


@dataclass(frozen=True)
class PrefillDone:
    """The prompt is computed.

    Attributes:
        prompt_tokens: its length n.
        cached_tokens: of those, taken from the cache (``hashing.reusable_tokens``).
        cached_blocks: leading full blocks served from the cache.
        miss_reason: why the cached prefix stopped where it did (None: it did not).
        load_s: seconds the lookup stage took (Redis, blob reads, verification, copy).
        prefill_s: seconds from admission to the first token's logits (``load_s`` included).
        tail_tokens: of ``cached_tokens``, those a tail served (``hashing.tails``).
    """

    prompt_tokens: int
    cached_tokens: int
    cached_blocks: int = 0
    miss_reason: MissReason | None = None
    load_s: float = 0.0
    prefill_s: float = 0.0
    tail_tokens: int = 0

    @property
    def kind(self) -> CacheKind:
        return cache_kind(self.prompt_tokens, self.cached_blocks, self.cached_tokens)

    @property
    def first_miss(self) -> tuple[int | None, MissReason | None]:
        """See ``store.outcomes.first_miss``."""
        return first_miss(self.prompt_tokens, self.cached_blocks, self.miss_reason, self.cached_tokens)


@dataclass(frozen=True)
class TokenDelta:
    """One generated token: its id, the text now safe to show, and log-probabilities under the
    model's distribution (before temperature): the token's own and the ``top_logprobs`` best."""

    token_id: int
    text: str
    logprob: float = 0.0
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Finished:
    """The completion is over: why, how many tokens it has, the text held back until the end (see
    ``TextStream``), and the stop string that ended it (``"stop"`` by a stop string; None when the
    model itself ended it); of its tokens, how many speculation drafted and how many of those were
    accepted (``engine.drafting``)."""

    finish_reason: FinishReason
    completion_tokens: int
    text: str = ""
    stop_sequence: str | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = PrefillDone | TokenDelta | Finished | Failed


class RequestHandle:
    """A submitted request as the engine sees it: where its events go, and whether it was
    cancelled.

    Args:
        emit: called with each event, on an engine thread; it must not block.
    """

    def __init__(self, emit: Callable[[Event], object]) -> None:
        self.emit = emit
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop the request at its next stage, prefill chunk or decode step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()
