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
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
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
    """A server tool or a bad choice is a 400 naming the field."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**{"model": "tiny", "max_tokens": 5, "messages": USER} | fields)
    assert param in caught.value.body["error"]["message"]
