"""proxy/serving/metadata.py: the client metadata rules, matched at the start of a system text."""

from __future__ import annotations

import pytest

from proxy.anthropic.protocol import MessagesRequest
from proxy.anthropic.turns import messages_turn
from proxy.serving.metadata import LeftOut, chat_without_metadata, leave_out

RULE = "claude-code-billing-header"
HEADERS = [
    "x-anthropic-billing-header: cc_version=2.1.42.834; cc_entrypoint=cli; cch=65abc;",
    "x-anthropic-billing-header: cc_version=2.1.197.c8e; cc_entrypoint=sdk-ts;",
    "x-anthropic-billing-header: cc_version=2.1.197.4f3; cc_entrypoint=cli; cch=00000; cc_workload=cron;",
    "x-anthropic-billing-header: cc_version=2.1.197.76b; cc_entrypoint=cli; cc_is_subagent=true;",
]


@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("after", ["", "You are Claude Code.", "\nYou are Claude Code.", " \r\nYou are"])
def test_the_billing_header_alone_is_left_out(header: str, after: str) -> None:
    """Each version's header, alone or joined to the text after it (with or without a line
    break): the header and its line's end go, the text after it stays."""
    text, left = leave_out(header + after, "system[0]")
    assert text == after.lstrip(" \r\n")
    assert left == [LeftOut(RULE, "system[0]")]


@pytest.mark.parametrize(
    "text",
    [
        "You are Claude Code.\nx-anthropic-billing-header: cc_version=2.1.1.abc; cc_entrypoint=cli;",
        "x-anthropic-billing-header: a header of another shape",
        "X-Anthropic-Billing-Header: cc_version=2.1.1.abc; cc_entrypoint=cli;",
        "",
    ],
)
def test_other_text_is_prompt(text: str) -> None:
    """Only the header at the very start of a text, in its own shape, matches."""
    assert leave_out(text, "system") == (text, [])


def test_a_chat_system_message_of_metadata_only_is_left_out_whole() -> None:
    """A system message that was only metadata goes; a user message's text is never touched."""
    messages = [
        {"role": "system", "content": HEADERS[0]},
        {"role": "system", "content": HEADERS[1] + "Be brief."},
        {"role": "user", "content": HEADERS[0]},
    ]
    kept, left = chat_without_metadata(messages)
    assert kept == [{"role": "system", "content": "Be brief."}, messages[2]]
    assert left == (LeftOut(RULE, "messages[0].content"), LeftOut(RULE, "messages[1].content"))


def test_messages_keep_their_marks_and_the_setting_keeps_the_block() -> None:
    """A Messages body: the billing block goes, the marks on the other blocks stay where they
    were; ``keep_metadata`` renders the body as sent."""
    mark = {"type": "ephemeral"}
    body = MessagesRequest(
        model="m",
        max_tokens=1,
        system=[
            {"type": "text", "text": HEADERS[0]},
            {"type": "text", "text": "Be brief.", "cache_control": mark},
        ],
        messages=[{"role": "user", "content": "hi"}],
    )
    turn = messages_turn(body, "t")
    assert turn.messages is not None and turn.messages[0] == {"role": "system", "content": "Be brief."}
    assert [m.message for m in turn.marks] == [0] and turn.left_out == (LeftOut(RULE, "system[0]"),)
    kept = messages_turn(body, "t", keep_metadata=True)
    assert kept.messages is not None and kept.messages[0]["content"] == HEADERS[0] + "Be brief."
    assert kept.left_out == ()
    only = messages_turn(
        MessagesRequest(
            model="m", max_tokens=1, system=HEADERS[2], messages=[{"role": "user", "content": "hi"}]
        ),
        "t",
    )
    assert only.messages == [{"role": "user", "content": "hi"}]
