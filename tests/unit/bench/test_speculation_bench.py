"""The speculation benchmarks' inputs and report: every kind has its prompts (the copy-heavy ones
start the copy they ask for), the sweep has at least 200 prompts over its kinds, and the report's
targets are judged on the worst copy-heavy kind."""

from __future__ import annotations

from bench.speculation import COPY_HEAVY, report, same_answers
from bench.speculation_sweep import LANGUAGES, prompts
from bench.workloads import copy_heavy


def test_every_kind_has_three_prompts_and_copies_start_in_the_prompt() -> None:
    kinds = copy_heavy()
    assert set(kinds) == {"prose", *COPY_HEAVY}
    assert all(len(requests) == 3 for requests in kinds.values())
    for name in ("rag-quote", "tool-args", "agent-echo"):  # code-edit's start has a name changed
        for prompt in kinds[name]:
            assert isinstance(prompt, str) and prompt[-20:] in prompt[:-20], name


def test_the_sweep_covers_200_prompts_of_every_kind_and_eight_languages() -> None:
    swept = prompts(48)
    assert sum(len(bodies) for bodies in swept.values()) >= 200
    assert set(swept) == {"prose", "code", "json", "tool-calls", "languages"}
    asked = {body["messages"][0]["content"] for body in swept["languages"]}
    assert len(LANGUAGES) == 8 and len(asked) == 48
    assert all("tools" in body for body in swept["tool-calls"])


def _runs(rate: dict[str, float], text: str = "a") -> list[dict]:
    return [{name: [{"tok_s": r, "tokens": 10, "text": text}] for name, r in rate.items()}]


def test_the_report_judges_each_target_on_its_worst_kind() -> None:
    ours = {"prose": 150.0, "rag-quote": 300.0, "code-edit": 400.0, "tool-args": 240.0, "agent-echo": 500.0}
    theirs = dict.fromkeys(ours, 100.0)
    runs = {
        "kvproxy": _runs(ours),
        "kvproxy --no-speculation": _runs(theirs),
        "llama.cpp, 2 threads": _runs(theirs),
        "llama.cpp, 1 thread": _runs(dict.fromkeys(ours, 50.0)),
        "llama.cpp prompt-lookup, 2 threads": _runs(theirs, text="b"),
    }
    lines = report(runs, {name: [10, 7] for name in ours})
    text = "\n".join(lines)
    assert "| prose: kvproxy >= 1.5 x llama.cpp | 1.50 x | yes |" in text
    assert "(worst: tool-args) | 2.40 x | no |" in text
    assert "7 of 10 (70%)" in text
    assert same_answers(runs, "kvproxy", "kvproxy --no-speculation") == (5, 5)
    assert same_answers(runs, "llama.cpp prompt-lookup, 2 threads", "llama.cpp, 2 threads") == (0, 5)
    assert "equal to llama.cpp, 2 threads's: 0 of 5" in text
