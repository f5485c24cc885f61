"""``Cores``: the threads to compute on follow the cores other processes leave free, with a margin
so a neighbour near the line does not flip the count at every reading."""

from __future__ import annotations

import logging
import sys

import pytest

from engine import cores
from engine.cores import Cores, Sample
from tests.helpers import Clock


def fed(total: int, readings: list[float], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads ``Cores(total)`` answers after each reading of others' load, in cores (a fake
    clock and fake accounts: one window apart, others busy for that many cores' worth)."""
    clock = Clock()
    state = {"busy": 0, "own": 0}

    def sample(_cpus: frozenset[int], now: float) -> Sample:
        return Sample(now, state["busy"], state["own"])

    monkeypatch.setattr(cores, "read_sample", sample)
    counted = Cores(total, window_s=1.0, clock=clock)
    answers = []
    for others in readings:
        clock.advance(1.0)
        state["own"] += 50 * cores.TICKS_PER_S // 100  # this process: half a core, never counted
        state["busy"] += round((others + 0.5) * cores.TICKS_PER_S)
        answers.append(counted.now())
    return answers


def test_a_busy_core_is_left_to_its_owner(monkeypatch, caplog) -> None:
    """Quiet: every core; a neighbour on one core: one fewer; on both: one thread, never none.
    Each change is logged, with the load that caused it."""
    caplog.set_level(logging.INFO, logger="engine.cores")
    assert fed(2, [0.0, 1.0, 1.0, 2.0, 0.0], monkeypatch) == [2, 1, 1, 1, 2]
    assert [r.getMessage() for r in caplog.records] == [
        "other processes keep about 1.0 of the 2 cores busy: computing on 1 thread",
        "other processes keep about 0.0 of the 2 cores busy: computing on 2 threads",
    ]
    assert fed(4, [0.0, 1.0, 2.2, 0.9, 0.1], monkeypatch) == [4, 3, 2, 3, 4]


def test_a_neighbour_near_the_line_does_not_flip_the_count(monkeypatch) -> None:
    """Taken above half a core, freed only below a quarter: 0.4 after 0.6 keeps the core taken."""
    assert fed(2, [0.4, 0.6, 0.4, 0.3, 0.2, 0.4], monkeypatch) == [2, 1, 1, 1, 2, 2]


def test_between_readings_the_answer_stands(monkeypatch) -> None:
    """Within a window nothing is read: the last answer holds."""
    clock = Clock()
    counted = Cores(2, window_s=1.0, clock=clock)
    calls = []
    monkeypatch.setattr(cores, "read_sample", lambda *args: calls.append(args))
    clock.advance(0.5)
    assert counted.now() == 2 and calls == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc accounts are Linux's")
def test_the_accounts_are_read_from_proc() -> None:
    """On Linux a reading has this process's CPU time and the cores' busy time."""
    sample = cores.read_sample(frozenset({0}), 1.0)
    assert sample is not None and sample.busy > 0 and sample.own >= 0
