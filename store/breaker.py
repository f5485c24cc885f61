"""A circuit breaker for the Redis index: after a failure, stop trying for a while."""

from __future__ import annotations

import threading
import time


class CircuitBreaker:
    """Open for ``cooldown_s`` seconds after a failure; closed again after a success.

    While open, callers skip Redis entirely (a cache miss costs nothing); once the cooldown has
    passed, the next call is let through as a probe.
    """

    def __init__(self, cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        self._open_until = 0.0
        self._lock = threading.Lock()

    def allow(self) -> bool:
        """Whether a call may try Redis now."""
        return time.monotonic() >= self._open_until

    def failure(self) -> bool:
        """Record a failure; returns True when this opened a closed breaker (log it once)."""
        with self._lock:
            was_closed = self._open_until == 0.0
            self._open_until = time.monotonic() + self.cooldown_s
            return was_closed

    def success(self) -> bool:
        """Record a success; returns True when this closed an open breaker."""
        with self._lock:
            was_open = self._open_until > 0.0
            self._open_until = 0.0
            return was_open
