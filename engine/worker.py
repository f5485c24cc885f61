"""The engine: one model thread computing steps, fed by the scheduler and the lookup stage.

A request goes ``submit`` -> scheduler (waits, is admitted) -> loader threads (its cached prefix
becomes its past) -> model thread (prefill chunks taking turns, then batched decode steps), and
its events go to the caller's ``emit`` as they happen; with nothing else to do, the model thread
computes the starts of next turns (``engine.render_ahead``), then audits sampled hits
(``engine.audit``). Its whole loop::

    while (step := scheduler.next_step(loader.load, background)) is not None:
        fit_threads(step)
        if step.idle:
            ahead.step() if ahead.pending else auditor.step()
        else:
            runner.run(step)
            scheduler.step_done(step)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

from engine.audit import Auditor, AuditResult
from engine.buffers import BufferPool
from engine.constraint import Constraint
from engine.cores import Cores
from engine.decoding import Decoder, pick_decoder
from engine.forward import use_batched_attention
from engine.kernels.native import NativeDecoder
from engine.model.loading import LoadedModel
from engine.parts import ModelParts
from engine.prefix_stage import PrefixLoader
from engine.render_ahead import RenderAhead
from engine.requests import Event, GenerationRequest, RequestHandle
from engine.runner import Runner
from engine.sampling import Sampler
from engine.scheduler import Scheduler, Step
from engine.sequence import Sequence
from engine.stats import EngineStats
from engine.text import TextStream
from hashing import Namespace
from store.interface import PrefixCache

log = logging.getLogger(__name__)


class Engine:
    """Runs requests on a model thread, through an optional prefix cache, batching decodes.

    Args:
        loaded: the model (switched to the batched attention of ``engine.forward``).
        cache: the prefix cache, or None to serve uncached (``--no-cache``).
        max_queue: requests waiting beyond the admitted ones; more raise ``EngineBusy``.
        max_batch: most requests admitted at once (loading, prefilling or decoding together).
        audit_rate: fraction of cache hits recomputed cold in idle time (``engine.audit``).
        decode_threads: threads of the native decode step (None: torch's, the cores); they share
            each step's work as they run, so a busy core does not hold the step up
            (``engine/kernels/team.h``).
        speculation: draft tokens from each sequence's own (``engine.drafting``) and verify them
            in the native step, several tokens a step where drafts are right; the tokens are those
            decoding without it gives. Off for any other decode step.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PrefixCache | None,
        max_queue: int = 64,
        max_batch: int = 4,
        audit_rate: float = 0.0,
        decode_threads: int | None = None,
        speculation: bool = True,
    ) -> None:
        self.loaded, self.cache, self.audit_rate = loaded, cache, audit_rate
        self.speculation = speculation
        self.cores = Cores(torch.get_num_threads())
        self.decode_threads = decode_threads or self.cores.total
        use_batched_attention(loaded.model)
        spec = loaded.kv_spec
        like = torch.empty(
            (spec.num_layers, spec.num_kv_heads, 0, spec.head_dim),
            dtype=spec.torch_dtype,
            device=loaded.device,
        )
        self.buffers = BufferPool(like, keep=max_batch + 1)
        self.scheduler = Scheduler(max_queue, max_batch)
        self.loader = PrefixLoader(loaded, cache, self.buffers, max_batch, self.scheduler.loaded)
        # NOTE: every model computation, the choice of decode step included, runs on this one
        # thread: each thread that runs parallel operations gets an OpenMP team of its own, and
        # more team threads than cores make them all sleep between operations (a third slower).
        self.decoder: Decoder
        self.auditor: Auditor
        self.runner: Runner
        self.ahead: RenderAhead
        self._failed: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(like,), name="kvproxy-model", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed

    def _run(self, like: torch.Tensor) -> None:
        try:
            self.decoder = pick_decoder(self.loaded, like, self.decode_threads)
            parts = ModelParts(self.loaded, self.cache, self.buffers, self.decoder)
            self.auditor = Auditor(parts, self.audit_rate)
            self.runner = Runner(parts, self.auditor, self.speculation)
            log.info("speculation: %s", _speculation(self.speculation, self.runner.speculate))
            self.ahead = RenderAhead(self.loaded, self.loader, self.runner)
        except BaseException as exc:  # raised again by __init__
            self._failed = exc
            return
        finally:
            self._ready.set()
        auditor, ahead = self.auditor, self.ahead

        def background() -> bool:
            return ahead.pending > 0 or auditor.pending > 0

        while (step := self.scheduler.next_step(self.loader.load, background)) is not None:
            self._fit_threads(step)
            if step.idle and ahead.pending:
                ahead.step()
            elif step.idle:
                auditor.step()
            else:
                self.runner.run(step)
                self.scheduler.step_done(step)

    def _fit_threads(self, step: Step) -> None:
        """torch's threads for ``step``: the cores other work leaves free (``engine.cores``); one
        for a step of native decoding alone, whose few torch operations (sampling) are small and
        whose team is the native step's own (an idle OpenMP team spins on the cores meanwhile)."""
        decoding_only = step.prefill is None and not step.idle and isinstance(self.decoder, NativeDecoder)
        threads = 1 if decoding_only else self.cores.now()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def submit(self, request: GenerationRequest, emit: Callable[[Event], object]) -> RequestHandle:
        """Queue a request; its events go to ``emit`` (called on engine threads, must not block).

        Raises:
            EngineBusy: ``max_queue`` requests are already waiting.
            GrammarError: ``request.grammar`` does not compile (``engine.constraint.check_grammar``
                first: it also builds, once, what compiling needs).
        """
        handle = RequestHandle(emit)
        sampler = Sampler(request.sampling, self.loaded.device)
        loaded = self.loaded
        text = TextStream(loaded.tokenizer, request.stop)
        seq = Sequence(request, handle, sampler, text, loaded.namespace(request.tenant))
        if request.grammar is not None:
            vocab = loaded.model.config.vocab_size
            seq.constraint = Constraint(loaded.tokenizer, vocab, request.grammar, loaded.eos_token_ids)
        self.scheduler.add(seq)
        return handle

    def flush_saves(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s`` seconds) until the blocks handed to the cache are stored;
        True when they all are (or there is no cache)."""
        return self.cache is None or self.cache.flush(timeout_s)

    def render_ahead(self, request: GenerationRequest) -> None:
        """Compute and store ``request``'s prompt (a next turn's start, ``prewarm`` set) in idle
        time (``engine.render_ahead``); a no-op without a cache."""
        if self.cache is not None:
            self.ahead.submit(request)
            self.scheduler.wake()

    def audit_imports(self, namespace: Namespace, chains: list[list[int]]) -> None:
        """Recompute imported chains (token ids from block 0) in idle time and have the cache serve
        their imported blocks only once they match (``engine.audit``)."""
        for token_ids in chains:
            self.auditor.submit_import(namespace, token_ids)
        self.scheduler.wake()

    def on_audit(self, listener: Callable[[AuditResult], object]) -> None:
        """Call ``listener`` with every audit result (on the model thread; it must not block)."""
        self.auditor.listeners.append(listener)

    @property
    def audits_pending(self) -> int:
        """Sampled hits waiting for idle time to be audited, or being audited."""
        return self.auditor.pending

    @property
    def audits_dropped(self) -> int:
        """Sampled hits never audited: more were waiting than ``engine.audit.MAX_PENDING``."""
        return self.auditor.dropped

    def stats(self) -> EngineStats:
        """A snapshot of the engine's token counters."""
        return self.runner.snapshot()

    @property
    def queue_depth(self) -> int:
        """Requests waiting (not counting admitted ones nor those whose client left)."""
        return self.scheduler.queue_depth

    @property
    def running(self) -> int:
        """Requests admitted: loading their cached prefix, prefilling or decoding."""
        return self.scheduler.running

    @property
    def kv_cache_usage(self) -> float:
        """Fraction (0 to 1) of the K/V room in use: positions held by admitted requests over
        ``max_batch`` full contexts (vLLM's ``kv_cache_usage_perc``)."""
        room = self.scheduler.max_batch * self.loaded.context_length
        return min(1.0, self.scheduler.kv_tokens / room)

    @property
    def idle(self) -> bool:
        """No request admitted or waiting."""
        return self.scheduler.idle

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the admitted and waiting requests, stop the model thread, flush cache saves."""
        self.scheduler.close()
        self._thread.join(timeout_s)
        if self.cache is not None and not self.cache.flush(timeout_s):
            log.warning("cache saves still pending after %.0f s at shutdown", timeout_s)


def _speculation(asked: bool, running: bool) -> str:
    if running:
        return "on (drafts from each sequence's own tokens, verified exactly by the native step)"
    if not asked:
        return "off (--no-speculation)"
    return "off (it needs the native decode step, which this model or device does not run)"
