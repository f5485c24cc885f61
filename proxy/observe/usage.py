"""Blocks and bytes the cache holds over the last hour, for the dashboard.

NOTE: sampled by each process on a daemon thread of its own (``CacheAdmin.usage`` is a Redis
round trip per node, never run on the event loop) and kept in its memory: the figures are the
whole deployment's, the history starts when the process does. Simpler than a shared series in
Redis, and every replica draws the same curve.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from store.background import yield_to_requests

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 30.0
KEEP_S = 3600.0


@dataclass(frozen=True)
class UsagePoint:
    """What the cache held at ``at`` (Unix seconds): blocks and blob bytes."""

    at: float
    blocks: int
    bytes: int


class UsageHistory:
    """``(time, blocks, bytes)`` read from ``read`` every ``interval_s`` seconds (the first at
    ``start``), for the last ``KEEP_S`` seconds; a failed read (None) is skipped."""

    def __init__(
        self, read: Callable[[], tuple[int, int] | None], interval_s: float = SAMPLE_EVERY_S
    ) -> None:
        self.read, self.interval_s = read, interval_s
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=int(KEEP_S / interval_s) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvproxy-usage", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        yield_to_requests()
        while True:
            try:
                self.sample()
            except Exception:  # a bug here must not end the samples
                log.exception("cannot sample the cache's usage")
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> None:
        """Read the cache's usage now and keep it."""
        held = self.read()
        if held is not None:
            with self._lock:
                self._samples.append((time.time(), *held))

    def points(self) -> list[UsagePoint]:
        """The samples of the last hour, oldest first."""
        since = time.time() - KEEP_S
        with self._lock:
            return [UsagePoint(t, n, b) for t, n, b in self._samples if t >= since]
