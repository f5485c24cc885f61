"""The fidelity audit: a sampled fraction of cache hits is computed again cold, in idle time.

Verification proves a block is the block that was stored; the audit checks that what was stored
was right. For a sampled hit the runner keeps the first token's logits and, for the first
``AUDIT_TOKENS`` steps, the token fed and the logits' argmax (``AuditCapture``). Once the model
thread has had nothing else to do for ``engine.scheduler.IDLE_GRACE_S``, the auditor prefills the
same prompt with no cache, one ``AUDIT_CHUNK_TOKENS`` chunk per idle step (a request that arrives
meanwhile waits for that one chunk at most), then feeds the hit's tokens (one idle step, through
``engine.decoding.feed``: the native step takes them in one call) and compares:

- the first token's logits: the max absolute difference, against the format's tolerance;
- each step's greedy choice: a different argmax is a mismatch (the answer diverged) unless the
  cold logits hold the two tokens within the tolerance (a near-tie).

A mismatch removes the hit's blocks from the cache (``PrefixCache.forget``) and logs their hashes;
with a lossy block format this is how the audit measures what the format costs on live traffic.

Imported blocks (``--audit-imports``) are audited before they are ever served: the auditor
prefills each imported chain's tokens cold, in the same idle steps, and hands its own K/V to the
cache (``PrefixCache.settle``), which serves the imported blocks that equal it within the
format's tolerance and removes the others.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from engine.decoding import feed
from engine.forward import prefill_chunks
from engine.kv import blocks_from_past, past_from_blocks
from engine.parts import ModelParts
from hashing import BLOCK_SIZE, BlockHash, Namespace, block_hashes
from store.interface import KVSpec

log = logging.getLogger(__name__)

AUDIT_TOKENS = 8
"""Steps of each audited hit compared: the first token's distribution and the next greedy choices."""
AUDIT_CHUNK_TOKENS = 64
"""Prompt tokens the audit prefills per idle step."""
MAX_PENDING = 32
"""Captured hits waiting for idle time; more are dropped (counted)."""
RELATIVE_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2, "int8": 5e-2}
"""Largest logit difference cached vs cold accepted, relative to the cold logits' largest magnitude,
by K/V dtype or lossy block format (``store.codec``). NOTE: float32 is the promise of docs/design.md
(logits agree to 1e-4); half precision rounds each value to 8 (bfloat16) or 11 (float16) bits, and
another chunking of a prompt moves logits by up to 1 % of their range (``engine.decoding``'s bound
too). int8 blocks moved the default model's first-token log-probabilities by up to 2.2e-2
(docs/benchmarks.md, "Block formats"); their tolerance leaves room for that, so a mismatch is a hit
that moved further."""


def tolerance(spec: KVSpec) -> float:
    """The relative tolerance (``RELATIVE_TOLERANCE``) of K/V held as ``spec`` says."""
    return RELATIVE_TOLERANCE.get(spec.dtype if spec.block_format == "exact" else spec.block_format, 2e-2)


@dataclass
class AuditCapture:
    """What a sampled hit produced (filled in on the model thread while it runs).

    Attributes:
        logits: the first token's logits ``[vocab_size]``, float32 on the CPU.
        tokens: the tokens the hit fed after its prompt (sampled however it asked), at most
            ``AUDIT_TOKENS``.
        greedy: the argmax of the hit's logits at each of those steps.
    """

    namespace: Namespace
    prompt_ids: tuple[int, ...]
    cached_blocks: int
    logits: torch.Tensor
    cached_tokens: int = 0
    tail: BlockHash | None = None  # the tail the hit was served (``hashing.tails``)
    tokens: list[int] = field(default_factory=list)
    greedy: list[int] = field(default_factory=list)

    def record(self, token: int, logits: torch.Tensor) -> None:
        """One step of the hit: ``logits`` ``[vocab_size]`` and the token chosen from them."""
        if len(self.tokens) < AUDIT_TOKENS:
            self.tokens.append(token)
            self.greedy.append(int(logits.argmax()))


@dataclass(frozen=True)
class AuditResult:
    """The comparison of one hit with its cold recomputation.

    Attributes:
        block_hashes: the hit's cached blocks, in chain order, then its tail's hash when it had one.
        max_logit_difference: max |hit - cold| over the first token's logits.
        tolerance: the largest difference accepted (absolute, from ``RELATIVE_TOLERANCE``).
        tokens_compared: greedy choices compared (the first token's included).
        mismatch: beyond tolerance, or ``diverged``: a greedy choice differs where the cold logits
            are no tie (the answer would).
    """

    namespace: Namespace
    prompt_tokens: int
    cached_tokens: int
    block_hashes: tuple[BlockHash, ...]
    max_logit_difference: float
    tolerance: float
    tokens_compared: int
    mismatch: bool
    diverged: bool = False


class Auditor:
    """Samples hits, recomputes them cold in idle time, reports ``AuditResult``s to listeners;
    used only on the model thread except for ``counts``.

    Args:
        rate: fraction of hits audited (0 turns the audit off).
    """

    def __init__(self, parts: ModelParts, rate: float) -> None:
        self.parts = parts
        self.rate = rate if parts.cache is not None else 0.0
        self.listeners: list[Callable[[AuditResult], object]] = []
        self.dropped = 0
        self._pending: deque[AuditCapture] = deque()
        self._imports: deque[tuple[Namespace, tuple[int, ...]]] = deque()  # chains, from any thread
        self._current: Iterator[None] | None = None
        self._random = random.Random()

    def capture(
        self,
        namespace: Namespace,
        prompt_ids: tuple[int, ...],
        cached_blocks: int,
        logits: torch.Tensor,
        cached_tokens: int,
        tail: BlockHash | None = None,
    ) -> AuditCapture | None:
        """A capture for a hit (``cached_tokens`` > 0: ``cached_blocks`` blocks, then ``tail``
        when a tail served the rest) sampled for audit, else None."""
        if cached_tokens == 0 or self.rate <= 0 or self._random.random() >= self.rate:
            return None
        logits = logits.detach().float().cpu().clone()
        return AuditCapture(namespace, prompt_ids, cached_blocks, logits, cached_tokens, tail)

    def submit_import(self, namespace: Namespace, token_ids: Sequence[int]) -> None:
        """Queue an imported chain (its full blocks' token ids, from block 0) for its audit; safe
        from any thread (a deque's append is atomic)."""
        self._imports.append((namespace, tuple(token_ids[: len(token_ids) // BLOCK_SIZE * BLOCK_SIZE])))

    def submit(self, capture: AuditCapture) -> None:
        """Queue a finished capture for idle time (dropped and counted beyond ``MAX_PENDING``)."""
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(capture)

    @property
    def pending(self) -> int:
        """Captures waiting or being audited."""
        return len(self._pending) + len(self._imports) + (self._current is not None)

    def step(self) -> None:
        """One idle step: the next chunk of the audit under way (starting the next one)."""
        if self._current is None:
            if self._imports:
                self._current = self._settle(*self._imports.popleft())
            elif self._pending:
                self._current = self._audit(self._pending.popleft())
            else:
                return
        try:
            next(self._current)
        except StopIteration:
            self._current = None
        except Exception:  # a bug in the audit must never stop the model thread
            log.exception("cache audit failed")
            self._current = None

    @torch.inference_mode()
    def _audit(self, capture: AuditCapture) -> Iterator[None]:
        n = len(capture.prompt_ids)
        buffers = self.parts.buffers.acquire(n + AUDIT_TOKENS)
        try:
            past = past_from_blocks([], 0, buffers)
            chunks = prefill_chunks(self.parts.loaded.model, capture.prompt_ids, past, 0, AUDIT_CHUNK_TOKENS)
            cold: list[torch.Tensor] = []
            for logits in chunks:
                cold[:] = [logits]
                yield
            if len(capture.tokens) > 1:
                cold.extend(feed(self.parts.decoder, capture.tokens[:-1], past, n))
                yield
        finally:
            self.parts.buffers.release(buffers)
        self._report(capture, cold)

    @torch.inference_mode()
    def _settle(self, namespace: Namespace, token_ids: tuple[int, ...]) -> Iterator[None]:
        """Prefill an imported chain cold, chunk by chunk, and hand its K/V to the cache."""
        if self.parts.cache is None or not token_ids:
            return
        buffers = self.parts.buffers.acquire(len(token_ids))
        try:
            past = past_from_blocks([], 0, buffers)
            for _ in prefill_chunks(self.parts.loaded.model, token_ids, past, 0, AUDIT_CHUNK_TOKENS):
                yield
            key, value = blocks_from_past(past, 0, len(token_ids) // BLOCK_SIZE)
        finally:
            self.parts.buffers.release(buffers)
        self.parts.cache.settle(namespace, token_ids, key, value, tolerance(self.parts.loaded.kv_spec))

    def _report(self, capture: AuditCapture, cold: list[torch.Tensor]) -> None:
        bound = tolerance(self.parts.loaded.kv_spec) * float(cold[0].abs().max())
        difference = float((cold[0].float().cpu() - capture.logits).abs().max())
        diverged = False
        for logits, greedy in zip(cold, capture.greedy, strict=False):
            best = int(logits.argmax())
            diverged |= best != greedy and float(logits[best] - logits[greedy]) > bound
        mismatch = diverged or difference > bound
        hashes = block_hashes(capture.prompt_ids[: capture.cached_blocks * BLOCK_SIZE], capture.namespace)
        hashes += [capture.tail] if capture.tail is not None else []
        compared = min(len(cold), len(capture.greedy))
        result = AuditResult(
            namespace=capture.namespace,
            prompt_tokens=len(capture.prompt_ids),
            cached_tokens=capture.cached_tokens,
            block_hashes=tuple(hashes),
            max_logit_difference=difference,
            tolerance=bound,
            tokens_compared=compared,
            mismatch=mismatch,
            diverged=diverged,
        )
        if mismatch and self.parts.cache is not None:
            why = "a greedy choice diverged" if diverged else "first-token logits beyond the tolerance"
            log.warning(
                "cache audit mismatch (%s; max logit difference %.3g, tolerance %.3g): removing the prefix's "
                "%d blocks (and tail) %s",
                why,
                difference,
                bound,
                len(hashes),
                " ".join(h.hex() for h in hashes),
            )
            self.parts.cache.forget(capture.namespace, hashes)
        for listener in self.listeners:
            listener(result)
