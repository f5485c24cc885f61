"""bench/workloads.py: the same seed sends the same prompts anywhere."""

from __future__ import annotations

from bench import workloads
from bench.workloads import Workload


def prompts(workload: Workload) -> list[tuple[str, tuple[str, ...]]]:
    return [(s.system, tuple(s.turns)) for s in workload.sessions]


def test_workloads_are_deterministic() -> None:
    """The same seed gives the same prompts; another seed others; orders permute one set."""
    for make in (
        lambda seed: workloads.shared_prefix(seed, 512),
        lambda seed: workloads.multi_turn(seed),
        lambda seed: workloads.document_qa(seed, order="random"),
        lambda seed: workloads.zero_reuse(seed),
    ):
        assert prompts(make(1)) == prompts(make(1)) and prompts(make(1)) != prompts(make(2))
    tile, inter = workloads.document_qa(3, order="tile"), workloads.document_qa(3, order="interleave")
    assert sorted(prompts(tile)) == sorted(prompts(inter)) and prompts(tile) != prompts(inter)
    docs = [s.system for s in tile.sessions]
    assert docs[:3] == docs[3:] and len(set(docs[:3])) == 3  # A B C A B C
    assert [s.system for s in inter.sessions][0::2] == [s.system for s in inter.sessions][1::2]  # A A B B C C
    control = workloads.zero_reuse(4)
    assert len({s.system[:20] for s in control.sessions}) == len(
        control.sessions
    )  # unique from the first token


def test_named_workloads_in_the_order_asked() -> None:
    chosen = workloads.workloads(["control", "docqa"], 0, [512], "tile")
    assert [w.name for w in chosen] == ["zero-reuse", "doc-qa-3x2-tile"]
