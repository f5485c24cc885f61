"""``Cores``: how many of this process's cores other work leaves it, read at run time.

torch's parallel operations split each operation's work evenly over a fixed team of threads and
wait for the slowest one; on a host whose cores are busy with other work (a neighbour's build, a
second server, a noisy VM), a thread that shares its core waits a scheduler slice at every one of
the thousands of operations in a forward pass, and the pass takes many times longer than on fewer
threads. So the model thread asks ``Cores`` before each step how many threads to run, and it
answers from the machine's own accounts: every core's busy time (``/proc/stat``, Linux) minus this
process's own CPU time (``/proc/self/stat``), over the last ``window_s``. Where they cannot be read,
every core counts as free.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""user, nice, system, irq, softirq, steal: the fields of a ``/proc/stat`` cpu line after its name
that are time the core was not idle (proc(5); guest time is inside user)."""


@dataclass(frozen=True)
class Sample:
    """Accounts at one moment: ``at`` (monotonic seconds), the busy ticks of this process's cores
    together, and this process's own CPU ticks (user + system, all its threads)."""

    at: float
    busy: int
    own: int


def read_sample(cpus: frozenset[int], now: float) -> Sample | None:
    """The accounts of ``cpus`` now, or None where ``/proc`` cannot be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            lines = stat.read().splitlines()
        with open("/proc/self/stat", encoding="ascii") as own:
            # NOTE: the command name (field 2) may hold spaces: fields are counted after its ')'
            fields = own.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = rest.split()
            busy += sum(int(values[i]) for i in BUSY_FIELDS if i < len(values))
    return Sample(now, busy, int(fields[11]) + int(fields[12]))  # utime, stime (fields 14, 15)


class Cores:
    """The number of threads to compute on now: this process's cores less those other work keeps
    busy.

    A core counts as taken once other processes use more than ``TAKEN`` of it, and as free again
    below ``FREED`` (a margin, so a neighbour near the line does not flip the count every window).

    Args:
        cores: the cores this process may run on (default: its CPU affinity).
        window_s: seconds between readings of the accounts (shorter windows are noisier).
        clock: monotonic seconds (tests pass a fake one).
    """

    TAKEN = 0.5
    FREED = 0.25

    def __init__(
        self, cores: int | None = None, window_s: float = 0.5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        affinity = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        self.total = cores or len(affinity) or os.cpu_count() or 1
        self._cpus = affinity
        self._window_s, self._clock = window_s, clock
        self._last = read_sample(self._cpus, clock()) if affinity else None
        self.others = 0.0
        """Cores' worth of CPU time other processes used in the last window."""
        self.threads = self.total

    def now(self) -> int:
        """Threads to compute on (1 to ``total``), read again when the last reading is older than
        ``window_s``; a change is logged."""
        if self._last is None or self._clock() - self._last.at < self._window_s:
            return self.threads
        sample = read_sample(self._cpus, self._clock())
        if sample is None or sample.at <= self._last.at:
            return self.threads
        ticks = (sample.at - self._last.at) * TICKS_PER_S
        self.others = max(0.0, (sample.busy - self._last.busy) - (sample.own - self._last.own)) / ticks
        self._last = sample
        self._set(self._threads_for(self.others))
        return self.threads

    def _threads_for(self, others: float) -> int:
        taken = self.total - self.threads  # cores counted as taken now
        while taken < self.total - 1 and others > taken + self.TAKEN:
            taken += 1
        while taken > 0 and others < taken - 1 + self.FREED:
            taken -= 1
        return self.total - taken

    def _set(self, threads: int) -> None:
        if threads != self.threads:
            log.info(
                "other processes keep about %.1f of the %d cores busy: computing on %d thread%s",
                self.others,
                self.total,
                threads,
                "" if threads == 1 else "s",
            )
            self.threads = threads
