"""What a run found: a per-request table of prompt and cached tokens, and the checks of issue 46's
acceptance (no request refused, but for a context-limit error the agent recovered from; a new
session of the same agent and a resumed one each reuse at least ``THRESHOLD`` of their first
prompt; the fresh and resumed sessions make tool calls)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.agents.recorder import Exchange, Recorder
from bench.agents.sessions import Session

THRESHOLD = 0.90
# NOTE: the hosted APIs' context-limit errors, which Claude Code and Codex recover from (Anthropic:
# "input length and `max_tokens` exceed context limit: X + Y > Z", "prompt is too long: N tokens >
# M maximum"; OpenAI: the context_length_exceeded code's "maximum context length")
CONTEXT_LIMIT_MARKERS = ("exceed context limit", "prompt is too long", "maximum context length")


@dataclass(frozen=True)
class Check:
    """One acceptance check: what, whether it held, and the numbers behind it."""

    name: str
    passed: bool
    detail: str


def percent(exchange: Exchange) -> float | None:
    """Cached tokens as a fraction of the prompt, None without a usage."""
    usage = exchange.usage
    if not usage.prompt or usage.cached is None:
        return None
    return usage.cached / usage.prompt


def rows(recorder: Recorder, sessions: list[Session]) -> list[dict[str, Any]]:
    """One row per model call, in the order sent, labelled with its session and step."""
    table = []
    for session in sessions:
        for step, exchange in enumerate(recorder.of(session.label), start=1):
            share = percent(exchange)
            reason = (exchange.explanation or {}).get("reason")
            table.append(
                {
                    "session": session.label,
                    "step": step,
                    "status": exchange.status,
                    "prompt": exchange.usage.prompt,
                    "cached": exchange.usage.cached,
                    "cached %": None if share is None else round(100 * share, 1),
                    "tool calls": exchange.usage.tool_calls,
                    "ended": exchange.usage.ended,
                    "seconds": round(exchange.seconds, 1),
                    "miss reason": reason if reason and share is not None and share < 1 else None,
                    "error": exchange.error_text or None,
                }
            )
    return table


def checks(recorder: Recorder, sessions: list[Session], min_tool_calls: int) -> list[Check]:
    """The acceptance checks over every agent's sessions."""
    found = []
    for session in sessions:
        calls = recorder.of(session.label)
        refused = [e for i, e in enumerate(calls) if _refused(e) and not _recovered(e, calls[i + 1 :])]
        detail = (
            "; ".join(f"{e.status} {e.error_text[:200]}" for e in refused[:3]) or f"{len(calls)} requests"
        )
        if not calls:
            detail = (
                f"no request reached the server (exit {session.returncode}): {session.output_tail[-300:]}"
            )
        found.append(Check(f"{session.label}: every request answered", bool(calls) and not refused, detail))
        if session.kind in ("new", "resumed"):
            # NOTE: the first prompt the server answered: a context-limit 400 the agent retried
            # with a smaller max_tokens comes first in every Claude Code step on a 32k model
            first = next((e for e in calls if e.usage.prompt), None)
            share = percent(first) if first else None
            shown = (
                "no usage"
                if first is None or share is None
                else (f"{first.usage.cached}/{first.usage.prompt} = {100 * share:.1f} %")
            )
            found.append(
                Check(
                    f"{session.label}: first prompt >= {100 * THRESHOLD:.0f} % cached",
                    share is not None and share >= THRESHOLD,
                    shown,
                )
            )
        if session.kind in ("fresh", "resumed"):
            tools = sum(e.usage.tool_calls for e in calls)
            found.append(
                Check(
                    f"{session.label}: >= {min_tool_calls} tool calls",
                    tools >= min_tool_calls,
                    f"{tools} tool calls",
                )
            )
    return found


def summary(table: list[dict[str, Any]]) -> str:
    """One Markdown row per session: its requests (answered, refused), its first answered prompt
    and the share of it cached, the share cached over all its answered prompts, its tool calls."""
    lines = [
        "| session | requests (refused) | first prompt | cached | all prompts cached | tool calls |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label in dict.fromkeys(row["session"] for row in table):
        rows_ = [r for r in table if r["session"] == label]
        answered = [r for r in rows_ if r["prompt"]]
        refused = sum(r["status"] >= 400 for r in rows_)
        first = answered[0] if answered else None
        total = sum(r["prompt"] for r in answered)
        cached = sum(r["cached"] or 0 for r in answered)
        first_cells = f"{first['prompt']} | {first['cached']} ({first['cached %']} %)" if first else " | "
        share = f"{100 * cached / total:.1f} %" if total else ""
        tools = sum(r["tool calls"] for r in rows_)
        lines.append(f"| {label} | {len(rows_)} ({refused}) | {first_cells} | {share} | {tools} |")
    return "\n".join(lines)


def _refused(exchange: Exchange) -> bool:
    return exchange.status >= 400 or bool(exchange.usage.errors)


def _recovered(exchange: Exchange, later: list[Exchange]) -> bool:
    """A context-limit error in the hosted API's words that the agent answered as a client of
    that API does (a smaller ``max_tokens``, a compacted history): a later request of the session
    was answered. Any other refusal is a fault."""
    text = exchange.error_text
    limit = any(marker in text for marker in CONTEXT_LIMIT_MARKERS)
    return limit and any(not _refused(e) for e in later)


def markdown(table: list[dict[str, Any]]) -> str:
    """The table as Markdown (what docs/agents.md quotes)."""
    if not table:
        return "(no model calls recorded)"
    columns = [c for c in table[0] if c != "error"]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in table:
        lines.append("| " + " | ".join("" if row[c] is None else str(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def save_refused(recorder: Recorder, folder: Path) -> list[Path]:
    """Each refused request's body and the server's answer, as ``<n>-<session>-<status>.json``
    and ``.answer`` files under ``folder``: the evidence a fault report quotes."""
    saved = []
    for n, exchange in enumerate(recorder.exchanges):
        if exchange.is_model_call and exchange.status >= 400:
            folder.mkdir(parents=True, exist_ok=True)
            stem = folder / f"{n:03d}-{exchange.label.replace('/', '-')}-{exchange.status}"
            stem.with_suffix(".json").write_bytes(exchange.body)
            stem.with_suffix(".answer").write_bytes(exchange.answer)
            saved.append(stem.with_suffix(".json"))
    return saved
