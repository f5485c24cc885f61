"""Client metadata written as system text: lines an agent puts into its system prompt for the
hosted API to read as metadata, never as prompt, and that change from session to session (or
request to request). Rendered, they would end a new session's reuse at the first block; so each
rule below finds its metadata at the start of a system text, and the dialect leaves it out of the
prompt (``Turn.left_out`` says what was left out, for the explanation). ``--keep-client-metadata``
renders everything as sent.

A system text is an Anthropic ``system`` block, or the content of a chat's system (or developer)
message: its text parts joined, as they are rendered.

The rules (``RULES``; docs/operations.md lists them):

- ``claude-code-billing-header``: Claude Code's attribution block (the Claude Agent SDK's too),
  ``x-anthropic-billing-header: cc_version=<version>.<3 hex>; cc_entrypoint=<name>;`` and, in some
  versions or setups, `` cch=<5 hex>;`` (a digest of the request, new on every request),
  `` cc_workload=<name>;``, `` cc_is_subagent=true;``. Source: Claude Code 2.1.197's bundled
  JavaScript, which builds it as its first system block and itself recognises the block by the
  ``x-anthropic-billing-header:`` prefix; vLLM's and LiteLLM's Anthropic routes drop a system
  block that starts with that prefix. Matched here as the prefix followed by its ``key=value;``
  fields, so the header alone is left out also where a gateway joined it to the text after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.tools.rendering import TemplateMessage


@dataclass(frozen=True)
class MetadataRule:
    """One kind of client metadata: its name (as the explanation reports it), the client that
    writes it, and the pattern of the metadata at the start of a system text."""

    name: str
    client: str
    pattern: re.Pattern[str]


RULES = (
    MetadataRule(
        "claude-code-billing-header",
        "Claude Code, the Claude Agent SDK",
        # NOTE: one or more `key=value;` fields, then the line's end: never text that follows them
        re.compile(r"x-anthropic-billing-header:(?:[ \t]*[A-Za-z0-9_]+=[^;\n]*;)+[ \t]*(?:\r?\n)?"),
    ),
)
"""The known client metadata, matched in this order."""


@dataclass(frozen=True)
class LeftOut:
    """Client metadata left out of a prompt: the rule that matched it and the field it was in."""

    rule: str
    param: str


def leave_out(text: str, param: str, rules: tuple[MetadataRule, ...] = RULES) -> tuple[str, list[LeftOut]]:
    """``text`` without the client metadata at its start (each rule's match, as often as one
    matches), and what was left out (named under ``param``)."""
    left: list[LeftOut] = []
    while (rule := next((r for r in rules if r.pattern.match(text)), None)) is not None:
        match = rule.pattern.match(text)
        assert match is not None
        text = text[match.end() :]
        left.append(LeftOut(rule.name, param))
    return text, left


def chat_without_metadata(
    messages: list[TemplateMessage],
) -> tuple[list[TemplateMessage], tuple[LeftOut, ...]]:
    """A chat's template messages with the client metadata at the start of each system message's
    text left out (a system message that held nothing else is left out whole), and what was left
    out, each named ``messages[i].content`` (``i`` the message's index in ``messages``)."""
    out: list[TemplateMessage] = []
    left: list[LeftOut] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "system" or not isinstance(content, str):
            out.append(message)
            continue
        text, found = leave_out(content, f"messages[{i}].content")
        left += found
        if text or not found:
            out.append(message | {"content": text} if found else message)
    return out, tuple(left)
