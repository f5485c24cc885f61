"""`kvproxy bench` against a real server: the hit rates it reports are the server's usage."""

from __future__ import annotations

import json
import subprocess
import sys

from bench import workloads
from bench.client import Client, Result, run


def test_reported_hit_rates_match_usage(cached) -> None:
    """Shared prefix and multi-turn against a real server: totals are the sum of usage, and the
    shared prefix does hit after the first question."""
    client = Client(f"{cached.server.base_url}/v1")
    seen: list[Result] = []
    shared = run(client, "tiny", workloads.shared_prefix(0, 512), max_tokens=4, on_result=seen.append)
    assert shared.requests == len(seen) == 4
    assert shared.prompt_tokens == sum(r.prompt_tokens for r in seen)
    assert shared.cached_tokens == sum(r.cached_tokens for r in seen) > 0
    assert shared.hit_rate == shared.cached_tokens / shared.prompt_tokens
    assert seen[0].cached_tokens == 0 and all(r.cached_tokens > 0 for r in seen[1:])
    chat = run(client, "tiny", workloads.multi_turn(0, users=2, rounds=2), concurrency=2, max_tokens=4)
    assert chat.requests == 4 and chat.cached_tokens > 0


def test_cli_writes_table_and_json(cached, tmp_path) -> None:
    """`kvproxy bench` prints a table and writes every workload, in the order asked, as JSON."""
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
