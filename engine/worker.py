"""The request worker: one thread that runs model compute, fed by a bounded queue.

Ranges of one request (n prompt tokens, k leading blocks cached and verified, g generated)::

    prompt_ids                                                  generated
    |<------ reused r = min(128k, n-1) ------>|<-- prefilled -->|<--- decoded --->|
    0                                         r                 n             n+g-1 (last token
    blocks saved after prefill:  [k, n // 128)                                     is never fed)
    blocks saved at the end:     [n // 128, (n + g - 1) // 128)

NOTE: r is capped at n - 1 so the last prompt token is always computed: its logits are what we
sample from. A fully cached prompt whose length is a multiple of 128 reuses 127 tokens of its
last block and prefills exactly one token; no token is ever fed twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import DynamicCache

from engine.generate import Cancelled, Sampler, SamplingParams, decode_step, prefill
from engine.kv import blocks_from_past, past_from_blocks
from engine.loading import LoadedModel
from engine.text import TextStream
from hashing import BLOCK_SIZE, Namespace, namespace_digest
from store.interface import PrefixCache, PrefixMatch

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "cancelled"]


class EngineBusy(Exception):
    """The request queue is full; retry later."""


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to compute.

    Attributes:
        prompt_ids: the prompt as token ids (at least one).
        max_tokens: most tokens to generate (at least one).
        sampling: temperature / top_p / seed.
        stop: strings that end the completion (excluded from its text).
        tenant: whose cache namespace to use (from the API key, never from the body).
        top_logprobs: how many most likely alternatives to report with each token.
        cache_ttl_s: TTL of the blocks this request stores or hits (None: the cache's default).
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    tenant: str = "default"
    top_logprobs: int = 0
    cache_ttl_s: int | None = None


@dataclass(frozen=True)
class PrefillDone:
    """The prompt is computed: ``cached_tokens`` of its ``prompt_tokens`` came from the cache
    (``cached_blocks`` blocks; the match stopped for ``miss_reason``, see ``PrefixMatch``), and
    ``prefill_s`` seconds went to loading and computing it."""

    prompt_tokens: int
    cached_tokens: int
    prefill_s: float
    cached_blocks: int = 0
    miss_reason: str | None = None


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
    finish_reason: FinishReason
    completion_tokens: int
    text: str = ""  # text held back until the end (see TextStream)


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = PrefillDone | TokenDelta | Finished | Failed


@dataclass
class EngineStats:
    """Token counters of this engine: every fed token is counted once, so prefill_tokens +
    decode_tokens is exactly what the model computed."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0


@dataclass
class PrefillResult:
    """A computed prompt: the logits of its last token and the past of all its tokens."""

    logits: torch.Tensor  # [vocab_size] float32
    past: DynamicCache  # K/V of positions [0, n)
    cached_tokens: int
    cached_blocks: int
    miss_reason: str | None = None


@dataclass
class RequestHandle:
    """The caller's side of a submitted request: events as they happen, and cancellation."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, event: Event) -> None:
        """Called from the worker thread."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self) -> None:
        """Stop the generation at the next prefill chunk or decode step."""
        self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self.events.get()
            yield event
            if isinstance(event, Finished | Failed):
                return


class Engine:
    """Runs requests one at a time on a worker thread, through an optional prefix cache.

    Args:
        loaded: the model.
        cache: the prefix cache, or None to serve uncached (``--no-cache``).
        max_queue: requests waiting beyond the running one; more raise ``EngineBusy``.
    """

    def __init__(self, loaded: LoadedModel, cache: PrefixCache | None, max_queue: int = 64) -> None:
        self.loaded = loaded
        self.cache = cache
        self.max_queue = max_queue
        # NOTE: a deque under a condition rather than queue.Queue: a waiting request whose client
        # left must give its place back at once, not when the worker reaches it.
        self._waiting: deque[tuple[GenerationRequest, RequestHandle]] = deque()
        self._ready = threading.Condition()
        self._running = False
        self._closing = False
        self._namespaces: dict[str, Namespace] = {}
        self.stats = EngineStats()
        self._thread = threading.Thread(target=self._run, name="kvproxy-engine", daemon=True)
        self._thread.start()

    def namespace(self, tenant: str) -> Namespace:
        """The cache namespace of ``tenant`` for this model and KV dtype."""
        if tenant not in self._namespaces:
            self._namespaces[tenant] = namespace_digest(
                model_fingerprint=self.loaded.fingerprint,
                kv_dtype=self.loaded.kv_spec.dtype,
                tenant=tenant,
            )
        return self._namespaces[tenant]

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request; events arrive on the returned handle (on the caller's event loop).

        Raises:
            EngineBusy: ``max_queue`` requests are already waiting.
        """
        handle = RequestHandle(asyncio.get_running_loop())
        with self._ready:
            self._drop_cancelled()
            if len(self._waiting) >= self.max_queue:
                raise EngineBusy
            self._waiting.append((request, handle))
            self._ready.notify()
        return handle

    def _drop_cancelled(self) -> None:
        for item in [item for item in self._waiting if item[1].cancelled.is_set()]:
            self._waiting.remove(item)
            item[1].emit(Finished("cancelled", 0))

    @property
    def queue_depth(self) -> int:
        """Requests waiting (not counting the running one nor those whose client left)."""
        with self._ready:
            return sum(1 for _, handle in self._waiting if not handle.cancelled.is_set())

    @property
    def idle(self) -> bool:
        """No request running or waiting."""
        with self._ready:
            return not self._running and not self._waiting

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the running request, stop the worker, flush pending cache saves."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout_s)
        if self.cache is not None and not self.cache.flush(timeout_s):
            log.warning("cache saves still pending after %.0f s at shutdown", timeout_s)

    # -- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._ready:
                self._running = False
                self._ready.wait_for(lambda: self._waiting or self._closing)
                if not self._waiting:
                    return
                request, handle = self._waiting.popleft()
                self._running = True
            try:
                if handle.cancelled.is_set():
                    handle.emit(Finished("cancelled", 0))
                else:
                    self.generate(request, handle.emit, handle.cancelled.is_set)
            except Exception as exc:
                log.exception("generation failed")
                handle.emit(Failed(exc))

    def prefill_prompt(
        self,
        namespace: Namespace,
        prompt_ids: tuple[int, ...],
        is_cancelled: Callable[[], bool],
        cache_ttl_s: int | None = None,
    ) -> PrefillResult:
        """Load the longest cached prefix of ``prompt_ids`` and prefill the rest.

        Raises:
            Cancelled: the request was cancelled between prefill chunks.
        """
        n = len(prompt_ids)
        match = PrefixMatch([], "cache disabled")
        if self.cache is not None:
            match = self.cache.lookup(namespace, prompt_ids, n // BLOCK_SIZE, cache_ttl_s)
        reused = min(match.num_tokens, n - 1)
        past = past_from_blocks(match.blocks, reused)
        logits = prefill(self.loaded.model, prompt_ids[reused:], past, reused, is_cancelled)
        self.stats.prefill_tokens += n - reused
        return PrefillResult(logits, past, reused, match.num_blocks, match.miss_reason)

    def generate(
        self,
        request: GenerationRequest,
        emit: Callable[[Event], None],
        is_cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Compute one request on this thread, emitting ``PrefillDone``, ``TokenDelta``s and
        ``Finished``."""
        namespace = self.namespace(request.tenant)
        prompt = request.prompt_ids
        n = len(prompt)
        start = time.perf_counter()
        try:
            result = self.prefill_prompt(namespace, prompt, is_cancelled, request.cache_ttl_s)
        except Cancelled:
            emit(Finished("cancelled", 0))
            return
        emit(
            PrefillDone(
                n, result.cached_tokens, time.perf_counter() - start, result.cached_blocks, result.miss_reason
            )
        )
        self.stats.requests += 1
        self.stats.prompt_tokens += n
        self.stats.cached_tokens += result.cached_tokens
        self._save(request, prompt, result.cached_blocks, result.past, n // BLOCK_SIZE)

        sampler = Sampler(request.sampling)
        text = TextStream(self.loaded.tokenizer, request.stop)
        generated: list[int] = []
        logits = result.logits
        reason: FinishReason = "length"
        while len(generated) < request.max_tokens:
            if is_cancelled():
                emit(Finished("cancelled", len(generated)))
                return
            token = sampler(logits)
            generated.append(token)
            if token in self.loaded.eos_token_ids:
                reason = "stop"
                break
            emit(TokenDelta(token, text.push(token), *_logprobs(logits, token, request.top_logprobs)))
            if text.stopped:
                reason = "stop"
                break
            if len(generated) < request.max_tokens:
                logits = decode_step(self.loaded.model, token, result.past, n + len(generated) - 1)
                self.stats.decode_tokens += 1
        emit(Finished(reason, len(generated), text.finish()))

        sequence = prompt + tuple(generated)
        fed = result.past.get_seq_length()  # prompt + every generated token but the last
        self._save(request, sequence, n // BLOCK_SIZE, result.past, fed // BLOCK_SIZE)

    def _save(
        self,
        request: GenerationRequest,
        token_ids: tuple[int, ...],
        first_block: int,
        past: DynamicCache,
        end_block: int,
    ) -> None:
        if self.cache is None or end_block <= first_block:
            return
        key, value = blocks_from_past(past, first_block, end_block)
        namespace = self.namespace(request.tenant)
        self.cache.save(
            namespace, token_ids[: end_block * BLOCK_SIZE], first_block, key, value, request.cache_ttl_s
        )


def _logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """Log-probability of ``token`` and the ``top`` most likely (id, log-probability) pairs."""
    logprobs = torch.log_softmax(logits, dim=-1)
    best = torch.topk(logprobs, top) if top > 0 else None
    pairs = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True))
    return float(logprobs[token]), pairs
