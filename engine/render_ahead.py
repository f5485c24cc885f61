"""Render-ahead: the start of a conversation's next turn, computed and stored in idle time.

When a chat turn ends, its next request will carry the history as the chat template renders it
again: the answer as text, the end-of-turn marker, the next turn's opening, and for templates that
drop reasoning from earlier turns, the answer without it. The server renders that start
(``proxy.serving.ahead``) and hands it here; with nothing else to compute, the model thread
computes what of it is not cached yet and stores it (blocks, then a tail), so the next turn
computes only its new message. Never before a request: work runs only in idle steps
(``engine.scheduler``), one prefill chunk per step, so a request arriving meanwhile waits for one
chunk at most; a start keeps its place across the requests computed in between. A job whose
uncached part is longer than ``MAX_TOKENS`` (not the start of a next turn, or its history was never
cached) is skipped. A long answer whose rendering differs from the tokens the model wrote (a tool
call's arguments serialized again, a call cut short and rendered as its text) is computed here
whole, in as many idle steps as it takes.
"""

from __future__ import annotations

import threading
from collections import deque

from engine.model.loading import LoadedModel
from engine.prefix_stage import PrefixLoader
from engine.requests import GenerationRequest, RequestHandle
from engine.runner import Runner
from engine.sampling import Sampler
from engine.scheduler import Step
from engine.sequence import Sequence, State
from engine.text import TextStream

MAX_PENDING = 32
"""Next-turn starts waiting for idle time; beyond that the oldest is dropped."""
MAX_TOKENS = 8192
"""The most uncached tokens one job computes (over as many idle steps as it has prefill chunks)."""


class RenderAhead:
    """Pending next-turn starts and their computation (see the module docstring)."""

    def __init__(self, loaded: LoadedModel, loader: PrefixLoader, runner: Runner) -> None:
        self.loaded, self.loader, self.runner = loaded, loader, runner
        self._jobs: deque[GenerationRequest] = deque(maxlen=MAX_PENDING)
        self._current: Sequence | None = None  # NOTE: only touched on the model thread
        self._lock = threading.Lock()
        self.submitted = self.computed = self.skipped = 0
        """Starts submitted; computed and stored; skipped (too long uncached, filling the context,
        or dropped when more than ``MAX_PENDING`` waited)."""

    def submit(self, request: GenerationRequest) -> None:
        """Queue the start of a next turn (``request.prewarm`` set); thread-safe. A start that
        fills the model's context (an answer the window ended) is skipped: no next turn fits."""
        assert request.prewarm, request
        with self._lock:
            self.submitted += 1
            if len(request.prompt_ids) >= self.loaded.context_length:
                self.skipped += 1
                return
            self.skipped += len(self._jobs) == MAX_PENDING
            self._jobs.append(request)

    @property
    def pending(self) -> int:
        """Starts waiting or under way."""
        with self._lock:
            return len(self._jobs) + (self._current is not None)

    def step(self) -> None:
        """Compute one prefill chunk of the start under way, else of the next pending one, and
        store the start once it is all computed (on the model thread, in an idle step)."""
        if self._current is None:
            with self._lock:
                if not self._jobs:
                    return
                request = self._jobs.popleft()
            self._current = self._begin(request)
        seq = self._current
        self.runner.run(Step(seq, []))
        if seq.state is State.PREFILLING:
            return
        skipped = seq.cancelled
        with self._lock:
            self._current = None
            self.skipped += skipped
            self.computed += not skipped

    def _begin(self, request: GenerationRequest) -> Sequence:
        """The sequence of a start, its cached prefix loaded; cancelled (its first step then gives
        its buffers back) when more than ``MAX_TOKENS`` of it are not cached."""
        seq = Sequence(
            request,
            RequestHandle(lambda _event: None),
            Sampler(request.sampling, self.loaded.device),
            TextStream(self.loaded.tokenizer, ()),
            self.loaded.namespace(request.tenant),
        )
        seq.admit()
        self.loader.load_now(seq)
        if seq.prefix is not None and seq.n - seq.prefix.cached_tokens > MAX_TOKENS:
            seq.handle.cancel()
        return seq

    @property
    def settled(self) -> bool:
        """Every submitted start is computed or skipped."""
        with self._lock:
            return self.computed + self.skipped == self.submitted
