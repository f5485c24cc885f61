"""Anthropic tool use with the anthropic SDK on the tiny model (generic format): ``tool_use``
blocks with schema-valid input, streamed as ``input_json_delta``, ``tool_result`` history, and a
``cache_control`` breakpoint on the tool definitions."""

from __future__ import annotations

import json

import anthropic
import pytest

TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
USER = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture
def client(cached):
    return anthropic.Anthropic(base_url=cached.server.base_url, api_key="unused")


def _valid(arguments: dict) -> None:
    assert set(arguments) == {"city", "days"} and 1 <= arguments["days"] <= 9


# NOTE: one call each: the random model would otherwise add calls up to max_tokens
@pytest.mark.parametrize(
    "choice",
    [
        {"type": "any", "disable_parallel_tool_use": True},
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    ],
)
def test_any_and_named_tool_choice_give_tool_use(client, choice) -> None:
    """Every reply under ``any``/``tool`` ends with ``tool_use`` and schema-valid input."""
    for _ in range(4):
        reply = client.messages.create(
            model="tiny", max_tokens=200, messages=USER, tools=[TOOL], tool_choice=choice
        )
        assert reply.stop_reason == "tool_use", reply
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert uses and all(u.id.startswith("toolu_") and u.name == "get_weather" for u in uses)
        for use in uses:
            _valid(use.input)


def test_streamed_tool_use_equals_the_whole_reply(client) -> None:
    """``input_json_delta`` pieces add up to the non-streamed input; the SDK's final message agrees."""
    kwargs = {
        "model": "tiny",
        "max_tokens": 200,
        "messages": USER,
        "tools": [TOOL],
        "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        partial = "".join(
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        )
        final = stream.get_final_message()
    expected = [b.input for b in whole.content if b.type == "tool_use"]
    assert [b.input for b in final.content if b.type == "tool_use"] == expected
    assert json.loads(partial) == expected[0] if len(expected) == 1 else True
    assert final.stop_reason == "tool_use"


def test_tool_results_and_cached_tool_definitions(cached, client) -> None:
    """A history with ``tool_use`` and ``tool_result`` renders; a breakpoint on the tools makes
    them hit on the next, different conversation with the same tools."""
    tool = TOOL | {"cache_control": {"type": "ephemeral"}}
    history = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo", "days": 1},
                }
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"}]},
    ]
    first = client.messages.create(model="tiny", max_tokens=5, messages=history, tools=[tool])
    assert first.usage.cache_read_input_tokens == 0
    cached.flush()
    other = [{"role": "user", "content": "Something else entirely, please."}]
    second = client.messages.create(model="tiny", max_tokens=5, messages=other, tools=[tool])
    assert second.usage.cache_read_input_tokens > 200  # the tool definitions and instructions


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "tools": [TOOL, {"type": "web_search_20250305", "name": "web_search"}],
                "tool_choice": {"type": "tool", "name": "web_search"},
            },
            "tool_choice",
        ),
        ({"tools": ["web_search"]}, "tools[0]"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools[0].input_schema"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}],
                    }
                ]
            },
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image"}]}
                        ],
                    },
                ]
            },
            "messages[2].content[0].content[0].type",
        ),
    ],
)
def test_unsupported_tools_are_400s(client, fields, param) -> None:
    """A bad tool, a bad choice (one naming a tool left out too: the message says it is one this
    server cannot run) is a 400 naming the field."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**{"model": "tiny", "max_tokens": 5, "messages": USER} | fields)
    message = caught.value.body["error"]["message"]
    assert param in message
    if fields.get("tool_choice") == {"type": "tool", "name": "web_search"}:
        assert "`web_search`, a tool this server cannot run" in message


def test_server_and_anthropic_defined_tools_are_left_out_with_a_warning(client) -> None:
    """Tools the server can neither run nor describe (Anthropic's server tools, such as the web
    search Claude Code offers by default, and its schema-less client tools) are left out of the
    prompt, named in ``x-kvproxy-warning``; the request is answered with the custom tools, and
    prompts the same as one that never offered them."""
    hosted = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
        {"type": "bash_20250124", "name": "bash"},
    ]
    kwargs = {"model": "tiny", "max_tokens": 5, "messages": USER}
    raw = client.messages.with_raw_response.create(**kwargs, tools=[hosted[0], TOOL, hosted[1]])
    warning = raw.headers["x-kvproxy-warning"]
    assert "tools[0] (web_search_20250305)" in warning and "tools[2] (bash_20250124)" in warning
    plain = client.messages.create(**kwargs, tools=[TOOL])
    assert _prompt(raw.parse()) == _prompt(plain)
    only = client.messages.with_raw_response.create(**kwargs, tools=hosted)
    assert _prompt(only.parse()) == _prompt(client.messages.create(**kwargs))
    assert "web_search" in only.headers["x-kvproxy-warning"]
    counted = client.messages.with_raw_response.count_tokens(model="tiny", messages=USER, tools=hosted)
    assert "tools[0] (web_search_20250305)" in counted.headers["x-kvproxy-warning"]


def _prompt(reply) -> int:
    """A reply's prompt length, in tokens: uncached, read and written."""
    usage = reply.usage
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
