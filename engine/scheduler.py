"""The scheduler: the engine's queues, admission, and what the next step computes.

A sequence moves ``WAITING -> LOADING -> PREFILLING -> DECODING -> FINISHED``:

- at most ``max_queue`` wait; beyond that ``add`` raises ``EngineBusy``;
- at most ``max_batch`` are admitted at once (loading, prefilling or decoding); an admitted
  sequence's cached prefix is loaded off the model thread (``engine.prefix_stage``);
- each step computes one prefill chunk of the first prefilling sequence, which then goes to the
  back of the line (prefills take turns, so a long prompt never holds up a short one for more
  than a chunk), and one decode step for every decoding sequence, batched;
- once no request has been admitted, waiting or computed for ``IDLE_GRACE_S``, a step is an
  *idle* step when there is background work (the fidelity audit, ``engine.audit``), one chunk of
  it at a time.

Thread-safe: requests arrive on the server's thread, loaded prefixes on loader threads, and the
model thread asks for steps.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.requests import EngineBusy, Finished
from engine.sequence import Sequence, State

IDLE_GRACE_S = 0.5
"""Seconds without any request before background work starts.

NOTE: so a client that sends its next request right after an answer (a chat turn, an agent's
next call) never finds a background chunk in its way; a request that arrives during one waits
for that one chunk only."""


@dataclass(frozen=True)
class Step:
    """What one turn of the model thread computes."""

    prefill: Sequence | None  # one chunk of this sequence's prompt
    decode: list[Sequence]  # the next token of each of these
    idle: bool = False  # no request to compute: one chunk of background work


class Scheduler:
    """Queues and admission (see the module docstring)."""

    def __init__(self, max_queue: int, max_batch: int, idle_grace_s: float = IDLE_GRACE_S) -> None:
        self.max_queue, self.max_batch, self.idle_grace_s = max_queue, max_batch, idle_grace_s
        # NOTE: a deque under a condition rather than queue.Queue: a waiting request whose client
        # left must give its place back at once, not when the worker reaches it.
        self._waiting: deque[Sequence] = deque()
        self._loading: list[Sequence] = []
        self._prefilling: deque[Sequence] = deque()  # in turn order
        self._decoding: list[Sequence] = []
        self._changed = threading.Condition()
        self._closing = False
        self._busy_at = time.monotonic()  # when a request was last added or computed

    def add(self, seq: Sequence) -> None:
        """Queue a sequence.

        Raises:
            EngineBusy: ``max_queue`` sequences are already waiting.
        """
        with self._changed:
            self._drop_cancelled()
            if len(self._waiting) >= self.max_queue:
                raise EngineBusy
            self._waiting.append(seq)
            self._busy_at = time.monotonic()
            self._changed.notify()

    def wake(self) -> None:
        """Background work arrived from another thread: let a waiting ``next_step`` look again."""
        with self._changed:
            self._changed.notify()

    def loaded(self, seq: Sequence) -> None:
        """The lookup stage of ``seq`` is over: it joins the prefills."""
        with self._changed:
            self._loading.remove(seq)
            self._prefilling.append(seq)
            self._changed.notify()

    def next_step(
        self, load: Callable[[Sequence], None], background: Callable[[], bool] = lambda: False
    ) -> Step | None:
        """Admit what fits (handing each admitted sequence to ``load``), then the next step: an
        idle step when no request is admitted or waiting and ``background()`` says there is work;
        waits while there is nothing to compute. None once closed and drained."""
        with self._changed:
            while True:
                self._drop_cancelled()
                while self._waiting and self._running() < self.max_batch:
                    seq = self._waiting.popleft()
                    seq.admit()
                    self._loading.append(seq)
                    load(seq)
                if self._prefilling or self._decoding:
                    prefill = self._prefilling[0] if self._prefilling else None
                    self._busy_at = time.monotonic()
                    return Step(prefill, list(self._decoding))
                if self._closing and not self._waiting and not self._loading:
                    return None
                quiet = time.monotonic() - self._busy_at
                if not self._waiting and not self._loading and background():
                    if quiet >= self.idle_grace_s:
                        return Step(None, [], idle=True)
                    self._changed.wait(self.idle_grace_s - quiet)
                    continue
                self._changed.wait()

    def step_done(self, step: Step) -> None:
        """Move the sequences of a computed step on: a prefill not over goes to the back of the
        line, one that is over starts decoding; finished sequences leave."""
        with self._changed:
            self._busy_at = time.monotonic()
            if step.prefill is not None:
                self._prefilling.popleft()
                if step.prefill.state is State.PREFILLING:
                    self._prefilling.append(step.prefill)
                elif step.prefill.state is State.DECODING:
                    self._decoding.append(step.prefill)
            self._decoding = [s for s in self._decoding if s.state is State.DECODING]

    def close(self) -> None:
        """Admit nothing new once the queue is drained; ``next_step`` then returns None."""
        with self._changed:
            self._closing = True
            self._changed.notify()

    @property
    def queue_depth(self) -> int:
        """Sequences waiting (not counting admitted ones nor those whose client left)."""
        with self._changed:
            return sum(1 for s in self._waiting if not s.cancelled)

    @property
    def running(self) -> int:
        """Sequences admitted: loading, prefilling or decoding."""
        with self._changed:
            return self._running()

    @property
    def kv_tokens(self) -> int:
        """Positions whose K/V the admitted sequences hold (read while they run: a gauge)."""
        with self._changed:
            admitted = [*self._loading, *self._prefilling, *self._decoding]
        return sum(seq.fed for seq in admitted)

    @property
    def idle(self) -> bool:
        """Nothing admitted or waiting."""
        with self._changed:
            return not self._waiting and self._running() == 0

    def _running(self) -> int:
        return len(self._loading) + len(self._prefilling) + len(self._decoding)

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(seq)
            seq.state = State.FINISHED
            seq.handle.emit(Finished("cancelled", 0))
