"""Anthropic's Messages API as coding agents send it today (Claude Code 2.1's shapes), with the
official ``anthropic`` client on the tiny model over real HTTP: a ``system`` message inside
``messages`` is rendered at its place (its breakpoints honoured, the prompt of a turn a prefix of
the next one's), thinking settings are satisfied by an answer without thinking blocks (their
shapes checked as the hosted API checks them), an assistant's thinking blocks in the history are
accepted and not rendered, and a tool whose schema uses a keyword the grammar cannot enforce
(``propertyNames``) is served with a warning header, unless it is ``strict``."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from proxy.http.warnings import WARNING_HEADER
from tests.replicas import text

BETA = "mid-conversation-system-2026-04-07"
"""The beta Claude Code announces when it sends ``system`` messages inside ``messages``."""
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli;"},
    {"type": "text", "text": "You are Claude Code, a coding agent. " + text(3, 60)},
    {
        "type": "text",
        "text": "Work in the repository. " + text(4, 200),
        "cache_control": {"type": "ephemeral"},
    },
]
"""A system prompt shaped like Claude Code's: the billing block, the identity, the instructions
with its breakpoint."""
AGENT = {
    "name": "Agent",
    "description": "Launch a sub-agent for a task.",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "prompt": {"type": "string"},
            "env": {
                "type": "object",
                "propertyNames": {"type": "string"},
                "additionalProperties": {"type": "string"},
            },
        },
        "required": ["description", "prompt"],
        "additionalProperties": False,
    },
}
"""A tool with ``propertyNames`` (a no-op here: JSON keys are strings), as two of Claude Code's
tools have it."""
READ = {
    "name": "Read",
    "description": "Read a file.",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
    "cache_control": {"type": "ephemeral"},
}
USER = {
    "role": "user",
    "content": [
        {"type": "text", "text": "<system-reminder>Today is Saturday.</system-reminder>"},
        {"type": "text", "text": "Which files are here? " + text(5, 40)},
    ],
}
REMINDER = {"role": "system", "content": "The user switched to plan mode: do not edit files. " + text(6, 30)}


def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def agent_request(sdk: anthropic.Anthropic, messages: list, **fields):
    """A Messages request with Claude Code's fields: its system blocks, tools, adaptive thinking,
    effort, metadata and beta header; the raw response (headers and the parsed message)."""
    return sdk.messages.with_raw_response.create(
        model="tiny",
        max_tokens=16,
        system=SYSTEM,
        messages=messages,
        tools=[AGENT, READ],
        metadata={"user_id": "user_abc_account_def_session_0123"},
        extra_headers={"anthropic-beta": f"claude-code-20250219,{BETA}"},
        extra_body={"temperature": 0},
        **({"thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"}} | fields),
    )


def test_a_claude_code_request_is_answered_without_thinking_with_a_warning(cached) -> None:
    """System blocks, a system message after the user's, adaptive thinking, effort, metadata and
    a tool with ``propertyNames``: answered (200) with no thinking block; the warning header
    names the tool's schema field, the tool and the keyword."""
    raw = agent_request(client(cached.server), [USER, REMINDER])
    reply = raw.parse()
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert all(block.type in ("text", "tool_use") for block in reply.content)
    warning = raw.headers[WARNING_HEADER]
    assert warning == 'tools[0].input_schema (tool "Agent"): schema keyword "propertyNames" is not enforced'
    assert "Read" not in warning
