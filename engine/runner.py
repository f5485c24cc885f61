"""The runner: computes one step on the model thread, and what follows from it.

A prefill chunk of one sequence; at the end of its prompt, ``PrefillDone``, the first token and
the prompt's new blocks and tail handed to the cache. A batched decode step of the others; each
token sampled and emitted. At the end of a sequence, ``Finished``, the blocks and tail its
completion completed handed to the cache (its last token fed first), its buffers given back.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from engine.audit import Auditor
from engine.buffers import GrowingLayer
from engine.drafting import Drafter
from engine.forward import prefill_chunks
from engine.kernels.native import MAX_RUN_TOKENS, NativeDecoder
from engine.parts import ModelParts
from engine.requests import Failed, Finished, FinishReason, TokenDelta
from engine.sampling import logprobs
from engine.scheduler import Step
from engine.sequence import Sequence, State
from engine.stats import EngineStats
from engine.storing import Storer

log = logging.getLogger(__name__)

STEPPED_SUFFIX_TOKENS = 16
"""The longest uncached suffix fed through the native multi-token step (``NativeDecoder.run``, in
runs of ``MAX_RUN_TOKENS``) rather than transformers' forward (whose fixed cost per call, on a long
past, is many decode steps').

NOTE: chosen for token-by-token steps on an AVX-512 CPU, and not raised for the multi-token step
without a measurement there. On a CPU without AVX-512 (Zen 3, SmolLM2, 1,600-token past, 2
threads), where the step runs its scalar code, 16 tokens took 0.77 s as one multi-token step (1.85 s
as single steps) and 0.14 s through transformers' forward.
"""


STEP_DRAFT_TOKENS = 16
"""Draft tokens one decode step checks, shared evenly among its sequences (one alone drafts up to
``engine.drafting.LONGEST_DRAFT``; 8 sequences 2 each; 17 or more none): each row costs arithmetic,
and a batch already fills the step's arithmetic with its own tokens."""


class Runner:
    """Runs steps (see the module docstring); only ever called from the model thread."""

    def __init__(self, parts: ModelParts, auditor: Auditor, speculate: bool = True) -> None:
        self.parts, self.auditor = parts, auditor
        # NOTE: drafts need a step whose rows are bit for bit single steps: the native one's
        decoder = parts.decoder
        self.speculate = speculate and isinstance(decoder, NativeDecoder)
        self.max_position = decoder.max_pos if isinstance(decoder, NativeDecoder) else 0
        self.storer = Storer(parts.cache)
        self.stats = EngineStats()

    def run(self, step: Step) -> None:
        """One prefill chunk and one batched decode step; a failure fails the sequences of that
        part with ``Failed`` (the others go on)."""
        if step.prefill is not None:
            self._guarded([step.prefill], self._prefill)
        decoding = [seq for seq in step.decode if seq.state is State.DECODING]
        if decoding:
            self._guarded(decoding, self._decode)

    def _guarded(self, sequences: list[Sequence], part: Callable[..., None]) -> None:
        try:
            part(*sequences)
        except Exception as exc:
            log.exception("generation failed")
            for seq in sequences:
                if seq.state is not State.FINISHED:
                    self._fail(seq, exc)

    def _prefill(self, seq: Sequence) -> None:
        """The next chunk of the prompt; at its end, the first token."""
        if seq.error is not None:
            self._fail(seq, seq.error)
            return
        if seq.cancelled:
            self._end(seq, "cancelled")
            return
        if seq.chunks is None:
            seq.chunks = self._chunks(seq)
        logits = next(seq.chunks)
        if seq.fed < seq.n:
            return
        n, prefix = seq.n, seq.prefix
        assert prefix is not None
        seq.handle.emit(seq.prefill_done())
        if seq.request.prewarm:
            self.stats.prewarm_tokens += n - prefix.cached_tokens
            self.storer.store(seq, seq.request.prompt_ids, prefix.cached_blocks, n)
            self._end(seq, "length")
            return
        self.stats.requests += 1
        self.stats.prompt_tokens += n
        self.stats.cached_tokens += prefix.cached_tokens
        self.stats.prefill_tokens += n - prefix.cached_tokens
        seq.state = State.DECODING
        if self.speculate:
            seq.drafter = Drafter(seq.request.prompt_ids, prefix.continuation)
        seq.audit = self.auditor.capture(
            seq.namespace,
            seq.request.prompt_ids,
            prefix.cached_blocks,
            logits,
            prefix.cached_tokens,
            prefix.tail_hash,
        )
        reason = self._next_token(seq, logits)
        # NOTE: saved after the first token is out, so storing never delays time to first token
        self.storer.store(seq, seq.request.prompt_ids, prefix.cached_blocks, n)
        for boundary in seq.request.boundaries:
            if 0 < boundary < n - 1:
                self.storer.tail(seq, seq.request.prompt_ids, boundary)
        if reason is not None:
            self._end(seq, reason)

    def _chunks(self, seq: Sequence) -> Iterator[torch.Tensor]:
        """The prefill of the uncached suffix: in chunks through transformers' forward, or, for a
        suffix of at most ``STEPPED_SUFFIX_TOKENS`` (a full or near-full hit, a next turn) and the
        native step, through its multi-token step, which on a long past is many times faster."""
        assert seq.prefix is not None
        past, start = seq.prefix.past, seq.prefix.cached_tokens
        suffix = seq.request.prompt_ids[start:]
        if len(suffix) <= STEPPED_SUFFIX_TOKENS and isinstance(self.parts.decoder, NativeDecoder):
            return self._stepped(past, suffix, start)
        return prefill_chunks(self.parts.loaded.model, suffix, past, start)

    def _stepped(self, past: Any, suffix: tuple[int, ...], start: int) -> Iterator[torch.Tensor]:
        """The suffix in runs of ``MAX_RUN_TOKENS`` tokens, one call of the native step each (its
        weights read once for the run); yields each run's last logits ``[vocab]``."""
        decoder = self.parts.decoder
        assert isinstance(decoder, NativeDecoder)
        for offset in range(0, len(suffix), MAX_RUN_TOKENS):
            yield decoder.run(suffix[offset : offset + MAX_RUN_TOKENS], past, start + offset)[-1]

    def _decode(self, *sequences: Sequence) -> None:
        """Feed every sequence's last token, and its draft where it has one, in one forward pass;
        sample the next tokens, as many per sequence as its draft was right (``_accept``)."""
        for seq in sequences:
            if seq.cancelled:
                self._end(seq, "cancelled")
        running = [seq for seq in sequences if seq.state is State.DECODING]
        if not running:
            return
        share = STEP_DRAFT_TOKENS // len(running)
        drafts = [self._draft(seq, share) for seq in running]
        tokens: list[int] = []
        pasts: list[Any] = []
        positions: list[int] = []
        starts = [seq.fed for seq in running]
        for seq, draft, fed in zip(running, drafts, starts, strict=True):
            rows = [seq.generated[-1], *draft]
            tokens += rows
            pasts += [seq.past] * len(rows)
            positions += range(fed, fed + len(rows))
        start = time.perf_counter()
        logits = self.parts.decoder(tokens, pasts, positions)
        self.stats.decode_step_seconds += time.perf_counter() - start
        self.stats.decode_steps += 1
        row = 0
        for seq, draft, fed in zip(running, drafts, starts, strict=True):
            reason = self._accept(seq, draft, logits[row : row + 1 + len(draft)], fed)
            row += 1 + len(draft)
            if reason is not None:
                self._end(seq, reason)

    def _draft(self, seq: Sequence, most: int) -> list[int]:
        """The sequence's draft for this step ([] without speculation): at most ``most`` tokens,
        no longer than its answer and the model's context still allow past the token it is sure
        to get."""
        if seq.drafter is None or most <= 0:
            return []
        left = min(seq.request.max_tokens - len(seq.generated), self.max_position - seq.fed) - 1
        return seq.drafter.draft(seq.generated, min(most, left))

    def _accept(self, seq: Sequence, draft: list[int], logits: torch.Tensor, fed: int) -> FinishReason | None:
        """Sample from ``logits`` ``[1 + len(draft), vocab]`` row by row (row i follows draft token
        i - 1, or the last token for row 0) while each sampled token equals the draft's next, then
        drop the K/V of the draft tokens not kept: the past ends at ``fed`` plus the rows used, so
        the last token sampled is fed next step, as without a draft. The finish reason, if any."""
        accepted = 0
        reason = None
        for i, row in enumerate(logits):
            reason = self._next_token(seq, row)
            if reason is not None or i == len(draft) or seq.generated[-1] != draft[i]:
                break
            accepted += 1
        self.stats.decode_tokens += accepted + 1
        if draft:
            assert seq.drafter is not None and seq.past is not None
            seq.drafter.update(len(draft), accepted)
            self.stats.draft_tokens += len(draft)
            self.stats.accepted_tokens += accepted
            for layer in seq.past.layers:
                cast(GrowingLayer, layer).grow_to(fed + accepted + 1)
        return reason

    def _next_token(self, seq: Sequence, logits: torch.Tensor) -> FinishReason | None:
        """Sample and emit the next token; the finish reason when the sequence ends with it."""
        if seq.cancelled:
            return "cancelled"
        # NOTE: the grammar masks this row only, on a copy; log-probabilities stay the model's
        token = seq.sampler(logits if seq.constraint is None else seq.constraint.mask(logits))
        seq.generated.append(token)
        if seq.audit is not None:
            seq.audit.record(token, logits)
        if token in self.parts.loaded.eos_token_ids:
            return "stop"
        logprob, top = logprobs(logits, token, seq.request.top_logprobs)
        seq.handle.emit(TokenDelta(token, seq.text.push(token), logprob, top))
        if seq.constraint is not None:
            seq.constraint.accept(token)
        if seq.text.stopped or (seq.constraint is not None and seq.constraint.complete):
            return "stop"
        return "length" if len(seq.generated) >= seq.request.max_tokens else None

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        """Feed the completion's last token (``_feed_last``) and store the blocks and tail it
        completed (not for a cancelled one), then emit ``Finished``.

        NOTE: stored first, so a client that sends its next turn the moment this one ends finds
        them (served from the writer's pending blocks until they are on disk).
        """
        drafter = seq.drafter
        drafts = (drafter.drafted, drafter.accepted) if drafter else (0, 0)
        if reason == "cancelled":
            seq.handle.emit(Finished("cancelled", len(seq.generated), "", None, *drafts))
        else:
            if self.parts.cache is not None and seq.generated:
                self._feed_last(seq)
            if seq.fed > seq.n:
                sequence = seq.request.prompt_ids + tuple(seq.generated)
                self.storer.answer(seq, sequence, seq.fed)
            text, stop = seq.text.finish(), seq.text.stop_sequence
            finished = Finished(reason, len(seq.generated), text, stop, *drafts)
            seq.handle.emit(finished)
            if seq.audit is not None:
                self.auditor.submit(seq.audit)
        self._release(seq)

    def _feed_last(self, seq: Sequence) -> None:
        """Feed a finished completion's last token: nothing was sampled after it, so it was never
        fed, yet the next turn's prompt holds it (the answer's last word, or the end-of-turn
        marker the template writes after an answer). One decode step before the answer ends (its
        text is all out); if it fails, what is stored ends a token earlier."""
        assert seq.past is not None
        try:
            start = time.perf_counter()
            self.parts.decoder([seq.generated[-1]], [seq.past], [seq.fed])
        except Exception:
            log.exception("feeding a finished completion's last token failed")
            return
        self.stats.decode_step_seconds += time.perf_counter() - start
        self.stats.decode_tokens += 1
        self.stats.decode_steps += 1

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        self._release(seq)
        seq.handle.emit(Failed(error))

    def _release(self, seq: Sequence) -> None:
        seq.state = State.FINISHED
        if seq.buffers is not None:
            self.parts.buffers.release(seq.buffers)
            seq.buffers = None

    def snapshot(self) -> EngineStats:
        """A copy of the counters."""
        return dataclasses.replace(self.stats)
