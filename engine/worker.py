"""The request worker: one thread that runs model compute, fed by a bounded queue.

Scheduling (continuous batching): up to ``max_batch`` requests run at once. Each turn of the
worker computes one prefill chunk of one request still in prefill (taking turns between them)
and then one decode step for every request past its prefill, all in one batched forward pass. A
long prompt therefore never holds up another request for more than one chunk at a time, and
concurrent decodes share each read of the weights.

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
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import DynamicCache

from engine.batch import decode_batch, use_batched_attention
from engine.generate import Sampler, SamplingParams, decode_step, prefill, prefill_chunks
from engine.kv import BufferPool, blocks_from_past, past_from_blocks
from engine.loading import LoadedModel
from engine.text import TextStream
from hashing import BLOCK_SIZE, Namespace, namespace_digest
from store.interface import PrefixCache, PrefixMatch

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "cancelled"]

INITIAL_ROOM_TOKENS = 1024
"""Completion tokens a request's K/V buffers have room for before they grow."""


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
    decode_tokens is exactly what the model computed; decode_tokens / decode_steps is the mean
    decode batch size."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_steps: int = 0


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


@dataclass
class _Sequence:
    """One request inside the worker, from its first prefill chunk to its last token."""

    request: GenerationRequest
    emit: Callable[[Event], None]
    is_cancelled: Callable[[], bool]
    sampler: Sampler
    text: TextStream
    started: float = field(default_factory=time.perf_counter)
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    result: PrefillResult | None = None
    chunks: Iterator[torch.Tensor] = field(default_factory=lambda: iter(()))
    generated: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def n(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def past(self) -> DynamicCache:
        assert self.result is not None, "the sequence has not begun"
        return self.result.past


class Engine:
    """Runs requests on a worker thread, through an optional prefix cache, batching decodes.

    Args:
        loaded: the model (switched to the batched attention of ``engine.batch``).
        cache: the prefix cache, or None to serve uncached (``--no-cache``).
        max_queue: requests waiting beyond the running ones; more raise ``EngineBusy``.
        max_batch: most requests running at once (decoding together, or being prefilled).
    """

    def __init__(
        self, loaded: LoadedModel, cache: PrefixCache | None, max_queue: int = 64, max_batch: int = 4
    ) -> None:
        self.loaded = loaded
        self.cache = cache
        self.max_queue = max_queue
        self.max_batch = max_batch
        use_batched_attention(loaded.model)
        spec = loaded.kv_spec
        like = torch.empty(
            (spec.num_layers, spec.num_kv_heads, 0, spec.head_dim),
            dtype=spec.torch_dtype,
            device=next(loaded.model.parameters()).device,
        )
        self.buffers = BufferPool(like, keep=max_batch + 1)
        # NOTE: a deque under a condition rather than queue.Queue: a waiting request whose client
        # left must give its place back at once, not when the worker reaches it.
        self._waiting: deque[tuple[GenerationRequest, RequestHandle]] = deque()
        self._ready = threading.Condition()
        self._prefilling: deque[_Sequence] = deque()  # in turn order
        self._decoding: list[_Sequence] = []
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
        """Requests waiting (not counting running ones nor those whose client left)."""
        with self._ready:
            return sum(1 for _, handle in self._waiting if not handle.cancelled.is_set())

    @property
    def running(self) -> int:
        """Requests being prefilled or decoded."""
        with self._ready:
            return len(self._decoding) + len(self._prefilling)

    @property
    def idle(self) -> bool:
        """No request running or waiting."""
        with self._ready:
            return not self._prefilling and not self._decoding and not self._waiting

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the running requests, stop the worker, flush pending cache saves."""
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
                self._drop_cancelled()
                if self._waiting and len(self._prefilling) + len(self._decoding) < self.max_batch:
                    request, handle = self._waiting.popleft()
                    self._prefilling.append(self._sequence(request, handle.emit, handle.cancelled.is_set))
                elif not self._prefilling and not self._decoding:
                    if self._closing and not self._waiting:
                        return
                    self._ready.wait()
                    continue
                prefilling = self._prefilling[0] if self._prefilling else None
            if prefilling is not None:
                over = self._step([prefilling], self._prefill_step)
                with self._ready:
                    self._prefilling.popleft()
                    if not over:
                        self._prefilling.append(prefilling)  # its next chunk after the others'
                    elif not prefilling.done:
                        self._decoding.append(prefilling)
            if self._decoding and self._step(self._decoding, self._decode_step):
                with self._ready:
                    self._decoding = [s for s in self._decoding if not s.done]

    def _step(self, sequences: list[_Sequence], step: Callable[..., bool]) -> bool:
        """Run ``step(*sequences)``; a failure ends every one of them with ``Failed``. Returns
        what the step returned (True on failure)."""
        try:
            return step(*sequences)
        except Exception as exc:
            log.exception("generation failed")
            for seq in sequences:
                if not seq.done:
                    self._release(seq)
                    seq.emit(Failed(exc))
            return True

    def _sequence(
        self, request: GenerationRequest, emit: Callable[[Event], None], is_cancelled: Callable[[], bool]
    ) -> _Sequence:
        text = TextStream(self.loaded.tokenizer, request.stop)
        return _Sequence(request, emit, is_cancelled, Sampler(request.sampling), text)

    def _begin(self, seq: _Sequence) -> None:
        """Load the longest cached prefix of the prompt into the sequence's past."""
        request = seq.request
        # NOTE: room for the usual completion; a longer one grows the past (one copy per doubling)
        seq.buffers = self.buffers.acquire(seq.n + min(request.max_tokens, INITIAL_ROOM_TOKENS))
        namespace = self.namespace(request.tenant)
        seq.result = self._load_prefix(namespace, request.prompt_ids, seq.buffers, request.cache_ttl_s)
        reused = seq.result.cached_tokens
        seq.chunks = prefill_chunks(self.loaded.model, request.prompt_ids[reused:], seq.result.past, reused)

    def _load_prefix(
        self,
        namespace: Namespace,
        prompt_ids: tuple[int, ...],
        buffers: tuple[torch.Tensor, torch.Tensor],
        cache_ttl_s: int | None,
    ) -> PrefillResult:
        n = len(prompt_ids)
        match = PrefixMatch([], "cache disabled")
        if self.cache is not None:
            match = self.cache.lookup(namespace, prompt_ids, n // BLOCK_SIZE, cache_ttl_s)
        reused = min(match.num_tokens, n - 1)
        past = past_from_blocks(match.blocks, reused, buffers)
        return PrefillResult(torch.empty(0), past, reused, match.num_blocks, match.miss_reason)

    def _prefill_step(self, seq: _Sequence) -> bool:
        """One prefill chunk (the first one after loading the cached prefix); at the end of the
        prompt, the first token. True when the prefill is over (the sequence then decodes unless
        it is ``done``)."""
        if seq.is_cancelled():
            self._end(seq, "cancelled")
            return True
        if seq.result is None:
            self._begin(seq)
        assert seq.result is not None
        seq.result.logits = next(seq.chunks)
        if seq.result.past.get_seq_length() < seq.n:
            return False
        result, n = seq.result, seq.n
        elapsed = time.perf_counter() - seq.started
        seq.emit(PrefillDone(n, result.cached_tokens, elapsed, result.cached_blocks, result.miss_reason))
        self.stats.requests += 1
        self.stats.prompt_tokens += n
        self.stats.cached_tokens += result.cached_tokens
        self.stats.prefill_tokens += n - result.cached_tokens
        reason = self._next_token(seq, result.logits)
        # NOTE: saved after the first token is out, so storing never delays time to first token
        self._save(seq.request, seq.request.prompt_ids, result.cached_blocks, result.past, n // BLOCK_SIZE)
        if reason is not None:
            self._end(seq, reason)
        return True

    def _decode_step(self, *sequences: _Sequence) -> bool:
        """Feed every sequence's last token in one forward pass and sample the next ones. True
        when some sequence ended."""
        for seq in sequences:
            if seq.is_cancelled():
                self._end(seq, "cancelled")
        running = [seq for seq in sequences if not seq.done]
        if running:
            model = self.loaded.model
            pasts = [seq.past for seq in running]
            tokens = [seq.generated[-1] for seq in running]
            positions = [seq.n + len(seq.generated) - 1 for seq in running]
            if len(running) == 1:
                logits = decode_step(model, tokens[0], pasts[0], positions[0]).unsqueeze(0)
            else:
                logits = decode_batch(model, tokens, pasts, positions)
            self.stats.decode_tokens += len(running)
            self.stats.decode_steps += 1
            for seq, row in zip(running, logits, strict=True):
                reason = self._next_token(seq, row)
                if reason is not None:
                    self._end(seq, reason)
        return any(seq.done for seq in sequences)

    def _next_token(self, seq: _Sequence, logits: torch.Tensor) -> FinishReason | None:
        """Sample and emit the next token; the finish reason when the sequence ends with it."""
        if seq.is_cancelled():
            return "cancelled"
        token = seq.sampler(logits)
        seq.generated.append(token)
        if token in self.loaded.eos_token_ids:
            return "stop"
        seq.emit(TokenDelta(token, seq.text.push(token), *_logprobs(logits, token, seq.request.top_logprobs)))
        if seq.text.stopped:
            return "stop"
        return "length" if len(seq.generated) >= seq.request.max_tokens else None

    def _end(self, seq: _Sequence, reason: FinishReason) -> None:
        """Emit ``Finished``; store the blocks the completion completed (not for a cancelled one)."""
        if reason == "cancelled":
            seq.emit(Finished("cancelled", len(seq.generated)))
        else:
            seq.emit(Finished(reason, len(seq.generated), seq.text.finish()))
            fed = seq.past.get_seq_length()  # prompt + every generated token but the last
            sequence = seq.request.prompt_ids + tuple(seq.generated)
            self._save(seq.request, sequence, seq.n // BLOCK_SIZE, seq.past, fed // BLOCK_SIZE)
        self._release(seq)

    def _release(self, seq: _Sequence) -> None:
        seq.done = True
        if seq.buffers is not None:
            self.buffers.release(seq.buffers)
            seq.buffers = None

    # -- one request on the caller's thread (tests, tools) --------------------------------------

    def generate(
        self,
        request: GenerationRequest,
        emit: Callable[[Event], None],
        is_cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Compute one request on this thread, emitting ``PrefillDone``, ``TokenDelta``s and
        ``Finished`` (the events the worker emits for a request running alone)."""
        seq = self._sequence(request, emit, is_cancelled)
        while not self._prefill_step(seq):
            pass
        while not seq.done:
            self._decode_step(seq)

    def prefill_prompt(
        self,
        namespace: Namespace,
        prompt_ids: tuple[int, ...],
        is_cancelled: Callable[[], bool],
        cache_ttl_s: int | None = None,
    ) -> PrefillResult:
        """Load the longest cached prefix of ``prompt_ids`` and prefill the rest (nothing is
        stored); the caller owns the returned past.

        Raises:
            Cancelled: the request was cancelled between prefill chunks.
        """
        buffers = self.buffers.acquire(len(prompt_ids))
        result = self._load_prefix(namespace, prompt_ids, buffers, cache_ttl_s)
        reused = result.cached_tokens
        result.logits = prefill(self.loaded.model, prompt_ids[reused:], result.past, reused, is_cancelled)
        return result

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
