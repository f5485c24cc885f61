"""`kvproxy bench`: workloads are reproducible, and the hit rates it reports are the server's usage."""

from __future__ import annotations

import json
import subprocess
import sys

from openai import OpenAI

from proxy import benchmark


def prompts(workload: benchmark.Workload) -> list[tuple[str, tuple[str, ...]]]:
    return [(s.system, tuple(s.turns)) for s in workload.sessions]


def test_workloads_are_deterministic() -> None:
    """The same seed gives the same prompts; another seed others; orders permute one set."""
    for make in (
        lambda seed: benchmark.shared_prefix(seed, 512),
        lambda seed: benchmark.multi_turn(seed),
        lambda seed: benchmark.document_qa(seed, order="random"),
        lambda seed: benchmark.zero_reuse(seed),
    ):
        assert prompts(make(1)) == prompts(make(1)) and prompts(make(1)) != prompts(make(2))
    tile, inter = benchmark.document_qa(3, order="tile"), benchmark.document_qa(3, order="interleave")
    assert sorted(prompts(tile)) == sorted(prompts(inter)) and prompts(tile) != prompts(inter)
    docs = [s.system for s in tile.sessions]
    assert docs[:3] == docs[3:] and len(set(docs[:3])) == 3  # A B C A B C
    assert [s.system for s in inter.sessions][0::2] == [s.system for s in inter.sessions][1::2]  # A A B B C C
    control = benchmark.zero_reuse(4)
    assert len({s.system[:20] for s in control.sessions}) == len(
        control.sessions
    )  # unique from the first token


def test_reported_hit_rates_match_usage(cached) -> None:
    """Shared prefix and multi-turn against a real server: totals are the sum of usage, and the
    shared prefix does hit after the first question."""
    client = OpenAI(base_url=f"{cached.server.base_url}/v1", api_key="unused")
    seen: list[benchmark.Result] = []
    shared = benchmark.run(
        client, "tiny", benchmark.shared_prefix(0, 512), max_tokens=4, on_result=seen.append
    )
    assert shared.requests == len(seen) == 4
    assert shared.prompt_tokens == sum(r.prompt_tokens for r in seen)
    assert shared.cached_tokens == sum(r.cached_tokens for r in seen) > 0
    assert shared.hit_rate == shared.cached_tokens / shared.prompt_tokens
    assert seen[0].cached_tokens == 0 and all(r.cached_tokens > 0 for r in seen[1:])
    chat = benchmark.run(
        client, "tiny", benchmark.multi_turn(0, users=2, rounds=2), concurrency=2, max_tokens=4
    )
    assert chat.requests == 4 and chat.cached_tokens > 0


def test_cli_writes_table_and_json(cached, tmp_path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "bench",
            "--base-url",
            f"{cached.server.base_url}/v1",
            "--model",
            "tiny",
            "--workload",
            "control",
            "--workload",
            "docqa",
            "--order",
            "tile",
            "--max-tokens",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "zero-reuse" in result.stdout and "doc-qa-3x2-tile" in result.stdout
    doc = json.loads(out.read_text())
    assert [d["workload"] for d in doc] == ["zero-reuse", "doc-qa-3x2-tile"]  # in the order asked
    assert doc[0]["cached_tokens"] == 0 and doc[1]["cached_tokens"] > 0
