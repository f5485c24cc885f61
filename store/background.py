"""Background threads of the cache (the writer, the collector) at the lowest CPU priority.

On a machine with as many busy threads as cores, a background thread that wakes during a decode
step takes a core from one of the step's threads, and the whole step waits at its next barrier
for that thread (a 2-thread step ran 3.7x slower beside one busy core). At nice 19 the scheduler
hands the core back as soon as the step's thread wakes; the background work runs in the gaps.
"""

from __future__ import annotations

import os
import threading


def yield_to_requests() -> None:
    """Give the calling thread (only it: on Linux a thread's nice value is its own) the lowest
    CPU priority. Does nothing where the platform has no per-thread priorities."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # NOTE: not Linux, or a sandbox that forbids it
        pass
