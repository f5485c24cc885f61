"""proxy/anthropic/caching.py: Anthropic's prompt-caching rules on a Messages body, with the
field each refusal names."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.anthropic.caching import breakpoint_error
from proxy.anthropic.protocol import MessagesRequest


def mark(ttl: str = "5m") -> dict[str, str]:
    return {"type": "ephemeral", "ttl": ttl}


def text(value: str = "x", ttl: str | None = None) -> dict[str, Any]:
    return {"type": "text", "text": value} | ({"cache_control": mark(ttl)} if ttl else {})


def body(**fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]} | fields
    )


def test_four_marks_in_the_cache_order_pass() -> None:
    tools = [{"name": "t", "input_schema": {"type": "object"}, "cache_control": mark("1h")}]
    request = body(
        tools=tools,
        system=[text(ttl="1h"), text(ttl="5m")],
        messages=[{"role": "user", "content": [text(ttl="5m")]}],
    )
    assert breakpoint_error(request) is None


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (
            {"system": [text(ttl="5m")] * 3, "messages": [{"role": "user", "content": [text(ttl="5m")] * 2}]},
            "cache_control",
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
        (
            {"system": [text(ttl="5m")] * 4, "cache_control": mark()},
            "cache_control",
            "Found 5.",
        ),
        (
            {"system": [text(ttl="5m")], "messages": [{"role": "user", "content": [text(ttl="1h")]}]},
            "messages[0].content[0].cache_control",
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block",
        ),
        (
            {
                "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": mark()}],
                "system": [text(ttl="1h")],
            },
            "system[0].cache_control",
            "processed in the following order: `tools`, `system`, `messages`",
        ),
        (
            {"messages": [{"role": "user", "content": [text(ttl="1h")]}], "cache_control": mark("5m")},
            "cache_control.ttl",
            "Top-level cache_control has ttl='5m' but the target block already has cache_control "
            "with ttl='1h'",
        ),
        (
            {"messages": [{"role": "user", "content": [text("a"), text("")]}]},
            "messages[0].content[1].text",
            "text content blocks must be non-empty",
        ),
        ({"system": [text("")]}, "system[0].text", "non-empty"),
    ],
)
def test_a_broken_rule_names_the_field(fields, param, says) -> None:
    assert breakpoint_error(body(**fields)) is not None
    named, message = breakpoint_error(body(**fields)) or ("", "")
    assert named == param and says in message


def test_the_top_level_mark_on_a_block_marked_alike_counts_once() -> None:
    request = body(system=[text(ttl="5m")] * 3, messages=[{"role": "user", "content": [text(ttl="5m")]}])
    assert (
        breakpoint_error(request.model_copy(update={"cache_control": request.system[0].cache_control}))
        is None
    )
