"""Responses input items as chat messages, field names as the Responses API names them, and what
the router reads of each dialect's answers."""

from __future__ import annotations

import pytest

from proxy.http.errors import OpenAIError
from proxy.responses.history import chat_messages
from proxy.responses.items import input_items, output_items
from proxy.responses.protocol import ResponsesRequest, responses_param
from proxy.responses.tools import ToolPlan, tool_plan
from proxy.router.replies import delta_text, reply_text, reply_usage, response_id
from proxy.tools.spec import ToolCall


def test_items_become_the_chat_an_agent_loop_would_send() -> None:
    """An assistant message and the calls after it are one assistant turn; a call's output is a
    tool message answering it."""
    items = input_items(
        [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
    )
    assert all(item["id"] for item in items)
    assert chat_messages(items) == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Oslo"}'}},
                {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert input_items("hi")[0]["content"] == [{"type": "input_text", "text": "hi"}]


def test_output_items_round_trip_to_chat() -> None:
    calls = [ToolCall("call_1", "w", '{"city": "Oslo"}')]
    assert [i["type"] for i in output_items("", calls, True, ToolPlan())] == ["function_call"]
    assert [i["type"] for i in output_items("", [], True, ToolPlan())] == ["message"]
    assert chat_messages(output_items("", calls, True, ToolPlan())) == [
        {"role": "assistant", "content": None, "tool_calls": [calls[0].as_openai()]}
    ]


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "function_call", "name": "w", "arguments": "{}"}, "input[0].call_id"),
        ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
        ({"role": "user", "content": [{"type": "input_file"}]}, "input[0].content[0]"),
        ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
        ({"type": "custom_tool_call_output", "output": "x"}, "input[0].call_id"),
    ],
)
def test_bad_items_name_their_field(item, param) -> None:
    with pytest.raises(OpenAIError) as err:
        input_items([item])
    assert err.value.param == param


@pytest.mark.parametrize(
    ("chat", "ours"),
    [
        ("messages[3].content", "input"),
        ("max_tokens", "max_output_tokens"),
        ("response_format.json_schema.name", "text.format.name"),
        ("tools[2].function.parameters", "tools[2].parameters"),
        ("tool_choice", "tool_choice"),
        (None, None),
    ],
)
def test_chat_fields_are_named_as_responses_names_them(chat, ours) -> None:
    assert responses_param(chat) == ours


def test_request_as_chat_fields() -> None:
    body = ResponsesRequest(
        model="m",
        input="x",
        max_output_tokens=5,
        tools=[{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "w"},
        text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}},
    )
    fields = body.chat_fields()
    assert fields["max_completion_tokens"] == 5
    assert fields["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    ]
    assert fields["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert fields["response_format"]["json_schema"] == {
        "name": "n",
        "schema": {"type": "object"},
        "strict": True,
    }


def test_router_reads_every_dialect() -> None:
    delta = {"type": "response.output_text.delta", "delta": "hi"}
    assert delta_text("responses", delta) == "hi"
    block = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "yo"}}
    assert delta_text("messages", block) == "yo"
    assert delta_text("chat", {"choices": [{"index": 0, "delta": {"content": "c"}}]}) == "c"
    body = {
        "object": "response",
        "id": "resp_1",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "a"}]}],
    }
    assert reply_text("responses", body) == "a" and response_id(body) == "resp_1"
    assert response_id({"type": "response.created", "response": {"id": "resp_2"}}) == "resp_2"
    assert reply_text("messages", {"content": [{"type": "text", "text": "b"}, {"type": "tool_use"}]}) == "b"
    usage = {"usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}}}
    assert reply_usage("responses", usage) == {
        "prompt_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    start = {
        "type": "message_start",
        "message": {
            "usage": {"input_tokens": 1, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2}
        },
    }
    assert reply_usage("messages", start) == {
        "prompt_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 5},
    }
    assert reply_usage("messages", {"type": "message_delta", "usage": {"output_tokens": 3}}) is None


def test_namespaces_flatten_and_hosted_tools_are_left_out() -> None:
    """A namespace's functions are offered under ``ns__name`` and reported back by name and
    namespace; hosted and custom tools are left out and named once each; an error in a chat
    tool names the tool where the request has it."""
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    plan = tool_plan(
        [
            {"type": "web_search", "external_web_access": False},
            {
                "type": "namespace",
                "name": "ns",
                "description": "d",
                "tools": [fn, {"type": "custom", "name": "c"}],
            },
            fn,
            {"type": "web_search"},
        ]
    )
    assert [t["function"]["name"] for t in plan.chat] == ["ns__f", "f"]
    assert plan.call_name("ns__f") == ("f", "ns") and plan.call_name("f") == ("f", None)
    assert plan.left_out == ["web_search", "custom"]
    assert plan.warning() is not None and "web_search, custom" in plan.warning()
    assert plan.param("tools[0].function.parameters") == "tools[1].tools[0].parameters"
    assert plan.param("tools[1].function.name") == "tools[2].name"
    assert tool_plan([fn]).warning() is None


def test_history_items_an_agent_keeps_render_as_tool_turns() -> None:
    """Other kinds of calls are the assistant's tool calls, their results tool messages; a
    result without call_id is a tool message naming its tool; the hosted model's own items
    are not shown."""
    items = input_items(
        [
            {"type": "reasoning", "summary": []},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "P"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
            {
                "type": "local_shell_call",
                "call_id": "s1",
                "action": {"command": ["ls"]},
                "status": "completed",
            },
            {"type": "local_shell_call_output", "id": "s1", "output": [{"type": "input_text", "text": "a"}]},
            {"type": "function_call", "call_id": "f1", "name": "f", "namespace": "ns", "arguments": "{}"},
            {"type": "web_search_call", "action": {"type": "search"}},
            {"type": "function_call_output", "name": "goal", "namespace": "goals", "output": "g"},
        ]
    )

    def call(call_id: str, name: str, arguments: str) -> dict:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        }

    assert chat_messages(items) == [
        call("c1", "apply_patch", '{"input": "P"}'),
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        call("s1", "local_shell", '{"command": ["ls"]}'),
        {"role": "tool", "tool_call_id": "s1", "content": "a"},
        call("f1", "ns__f", "{}"),
        {"role": "tool", "name": "goals__goal", "content": "g"},
    ]


def test_a_warning_names_a_few_left_out_kinds_and_counts_the_rest() -> None:
    """Left-out kinds are the request's text: a warning names the first few, each cut short, and
    counts the rest, so a body with many hosted tools gets a short header that says how many."""
    kinds = [f"hosted_{i}_" + "x" * 200 for i in range(20)]
    warning = tool_plan([{"type": kind} for kind in kinds]).warning()
    assert warning is not None and warning.endswith(" and 12 more") and len(warning) < 700
