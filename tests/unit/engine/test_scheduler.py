"""engine/scheduler.py: the queue bound, admission up to the batch, prefills taking turns."""

from __future__ import annotations

import threading

import pytest

from engine.requests import EngineBusy, Finished, GenerationRequest, RequestHandle
from engine.sampling import Sampler, SamplingParams
from engine.scheduler import Scheduler, Step
from engine.sequence import Sequence, State
from hashing import Namespace

NS = Namespace(bytes(16))


def seq(events: list | None = None) -> Sequence:
    handle = RequestHandle((events if events is not None else []).append)
    request = GenerationRequest((1, 2, 3), 4)
    return Sequence(request, handle, Sampler(SamplingParams()), text=None, namespace=NS)  # type: ignore[arg-type]


def load_into(scheduler: Scheduler, admitted: list[Sequence]):
    """A lookup stage that finishes at once."""

    def load(s: Sequence) -> None:
        admitted.append(s)
        s.state = State.PREFILLING
        scheduler.loaded(s)

    return load


def test_admission_stops_at_the_batch_and_the_queue_at_its_bound() -> None:
    """Batch 1, queue 2: a third request is refused; one is admitted, one keeps waiting."""
    scheduler = Scheduler(max_queue=2, max_batch=1)
    a, b = seq(), seq()
    scheduler.add(a)
    scheduler.add(b)
    with pytest.raises(EngineBusy):
        scheduler.add(seq())
    admitted: list[Sequence] = []
    step = scheduler.next_step(load_into(scheduler, admitted))
    assert admitted == [a] and step.prefill is a and step.decode == []
    assert (scheduler.running, scheduler.queue_depth) == (1, 1)


def test_prefills_take_turns_and_finished_sequences_leave() -> None:
    """a's chunk, then b's (a goes to the back), then a's again beside b's decode step."""
    scheduler = Scheduler(max_queue=8, max_batch=4)
    a, b = seq(), seq()
    for s in (a, b):
        scheduler.add(s)
    load = load_into(scheduler, [])
    step = scheduler.next_step(load)
    assert step.prefill is a and step.decode == []
    scheduler.step_done(step)  # a is not done prefilling: it goes behind b
    step = scheduler.next_step(load)
    assert step.prefill is b
    b.state = State.DECODING  # b's prompt is done
    scheduler.step_done(step)
    step = scheduler.next_step(load)
    assert step.prefill is a and step.decode == [b]
    a.state, b.state = State.FINISHED, State.FINISHED
    scheduler.step_done(step)
    assert scheduler.idle and scheduler.running == 0


def test_a_waiting_request_whose_client_left_gives_its_place_back() -> None:
    """A cancelled waiting request is finished as cancelled and frees its place in the queue."""
    scheduler = Scheduler(max_queue=1, max_batch=1)
    events: list = []
    gone = seq(events)
    scheduler.add(gone)
    gone.handle.cancel()
    scheduler.add(seq())  # would be refused if the cancelled one still held the place
    assert events == [Finished("cancelled", 0)]
    scheduler.close()


def test_background_work_gets_only_idle_steps() -> None:
    """With audit work pending, a scheduler quiet for the grace period returns idle steps; right
    after a request it keeps waiting (no idle step within the grace), and a request that arrives
    meanwhile is computed first; a closed scheduler stops even with background work left."""
    scheduler = Scheduler(max_queue=8, max_batch=4, idle_grace_s=0.0)
    load = load_into(scheduler, [])
    busy = lambda: True  # noqa: E731
    assert scheduler.next_step(load, busy) == Step(None, [], idle=True)
    scheduler.idle_grace_s = 3600.0  # NOTE: far longer than the test: the grace never runs out
    a, b = seq(), seq()
    scheduler.add(a)
    step = scheduler.next_step(load, busy)
    assert step.prefill is a and not step.idle
    a.state = State.FINISHED
    scheduler.step_done(step)
    steps: list[Step | None] = []
    waiter = threading.Thread(target=lambda: steps.append(scheduler.next_step(load, busy)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and steps == []  # still within the grace: no idle step
    scheduler.add(b)
    waiter.join(120)  # NOTE: a bound on a hang: it returns as soon as the step is taken
    assert len(steps) == 1 and steps[0].prefill is b and not steps[0].idle
    b.state = State.FINISHED
    scheduler.step_done(steps[0])
    scheduler.close()
    assert scheduler.next_step(load, busy) is None
