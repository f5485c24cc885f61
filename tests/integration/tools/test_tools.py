"""Tool calls and JSON answers with the official client on the tiny model (generic format):
every constrained answer parses and matches its schema, streamed and not, and the same tools in
another key order render to the same prompt.

NOTE: the tiny model is random, so its strings would run to ``max_tokens``; the schemas bound
them (the grammar then ends every answer)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 30},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "cet"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
REQUIRED = {
    "model": "tiny",
    "messages": USER,
    "tools": [WEATHER],
    "tool_choice": "required",
    "temperature": 0,
}


def post(api, body: dict) -> httpx.Response:
    return httpx.post(f"{api.server.base_url}/v1/chat/completions", json=body, timeout=300)


@pytest.fixture
def client(cached):
    return OpenAI(base_url=f"{cached.server.base_url}/v1", api_key="unused")


def _reversed(value):
    """``value`` with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: _reversed(value[k]) for k in reversed(value)}
    return value


def _valid_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "days"} and isinstance(args["city"], str)
    assert isinstance(args["days"], int) and args["days"] >= 1


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_calls_always_parse(client, choice) -> None:
    """Under ``required`` or a named tool, every answer (any seed) is a well-formed call."""
    for seed in range(6):
        reply = client.chat.completions.create(
            model="tiny", messages=USER, tools=[WEATHER, TIME], tool_choice=choice, seed=seed, max_tokens=200
        )
        choice0 = reply.choices[0]
        assert choice0.finish_reason == "tool_calls", choice0
        calls = choice0.message.tool_calls
        assert calls and all(c.id.startswith("call_") for c in calls)
        for call in calls:
            assert call.function.name in {"get_weather", "get_time"}
            if isinstance(choice, dict) or call.function.name == "get_weather":
                assert call.function.name == "get_weather"
                _valid_weather(call.function.arguments)


def allowed(mode: str, *names: str) -> dict:
    functions = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": functions}}


def test_allowed_tools_narrow_the_calls_not_the_prompt(client) -> None:
    """``allowed_tools``: every call (any seed) is of a listed tool, while every tool stays in the
    prompt (the same prompt tokens as with all tools callable: the prefix stays cached)."""
    for seed in range(4):
        reply = client.chat.completions.create(
            model="tiny",
            messages=USER,
            tools=[WEATHER, TIME],
            tool_choice=allowed("required", "get_time"),
            seed=seed,
            max_tokens=200,
        )
        calls = reply.choices[0].message.tool_calls
        assert calls and {c.function.name for c in calls} == {"get_time"}, reply
    every = client.chat.completions.create(
        model="tiny", messages=USER, tools=[WEATHER, TIME], tool_choice="required", max_tokens=1
    )
    assert reply.usage.prompt_tokens == every.usage.prompt_tokens


def test_streamed_calls_equal_the_whole_answer(client) -> None:
    """Streamed deltas of ``tool_calls[i].function.arguments`` add up to the non-streamed call."""
    kwargs = REQUIRED | {"max_tokens": 200}
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for call in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": "", "id": None})
            entry["id"] = entry["id"] or call.id
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(
        c.choices[0].delta.tool_calls or c.choices[0].finish_reason for c in chunks[1:]
    )  # no empty deltas
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_match_the_schema(client, stream) -> None:
    """``response_format`` json_schema (strict) and json_object: the content always parses."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        },
        "required": ["name", "tags"],
        "additionalProperties": False,
    }
    formats = [
        {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}},
        {"type": "json_object"},
    ]
    for form in formats:
        for seed in range(4):
            kwargs = {
                "model": "tiny",
                "messages": USER,
                "response_format": form,
                "seed": seed,
                "max_tokens": 300,
            }
            if stream:
                chunks = client.chat.completions.create(stream=True, **kwargs)
                content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = client.chat.completions.create(**kwargs)
                assert reply.choices[0].finish_reason == "stop"
                content = reply.choices[0].message.content
            value = json.loads(content)
            assert isinstance(value, dict)
            if form["type"] == "json_schema":
                assert set(value) == {"name", "tags"} and len(value["name"]) <= 20
                assert set(value["tags"]) <= {"a", "b"}


def test_auto_answers_are_text_or_calls(client) -> None:
    """Under ``auto`` the generic format's answer is always either text or well-formed calls."""
    for seed in range(6):
        reply = client.chat.completions.create(
            model="tiny", messages=USER, tools=[WEATHER], seed=seed, max_tokens=120
        )
        choice = reply.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            _valid_weather(choice.message.tool_calls[0].function.arguments)
        elif choice.finish_reason == "stop":
            assert isinstance(choice.message.content, str) and not choice.message.content.startswith(
                '{"response"'
            )


def test_tool_history_and_key_order_render_alike(cached) -> None:
    """A history with calls and results renders; the same tools in another key order and
    formatting give the same prompt tokens (the agent's prefix stays cached)."""
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reordered = json.loads(json.dumps(_reversed(WEATHER), indent=3))
    counts = []
    for tools in ([WEATHER], [reordered]):
        body = {"model": "tiny", "messages": history, "tools": tools, "max_tokens": 5}
        reply = post(cached, body)
        assert reply.status_code == 200, reply.text
        counts.append(reply.json()["usage"]["prompt_tokens"])
        cached.flush()
    assert counts[0] == counts[1]
    assert int(reply.headers["x-kvproxy-cached-tokens"]) == counts[1] - 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": allowed("required", "get_time")}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": allowed("required")}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": allowed("sometimes", "get_weather")}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "strict": True,  # NOTE: a tool that is not strict is served without `not`
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"not": {"type": "string"}}},
                            },
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_object"}, "tools": [WEATHER]}, "response_format"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!"}}},
            "response_format.json_schema.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"const": "a<|im_end|>"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"messages": [*USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}]},
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                # NOTE: text that is not JSON is a call cut short, kept
                                "function": {"name": "f", "arguments": {"a": 1}},
                            }
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(cached, body, param) -> None:
    """Nothing is dropped: an unsupported tool, choice or schema feature is a 400 naming it."""
    reply = post(cached, {"model": "tiny", "messages": USER} | body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_changed_tool_list_is_its_own_miss_reason(cached) -> None:
    """With ``x-kvproxy-explain: 1``, a prompt whose first differing token is in the tool
    definitions explains its miss as ``tools changed``."""
    many = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "Does one thing. " * 12}}
        for i in range(4)
    ]
    body = {"model": "tiny", "messages": USER, "tools": many, "max_tokens": 2}
    assert post(cached, body).status_code == 200
    cached.flush()
    changed = [*many[:3], {"type": "function", "function": {"name": "tool_3", "description": "Changed."}}]
    reply = httpx.post(
        f"{cached.server.base_url}/v1/chat/completions",
        json=body | {"tools": changed},
        headers={"x-kvproxy-explain": "1"},
        timeout=300,
    )
    explanation = reply.json()["kvproxy_cache_explanation"]
    assert explanation["reason"] == "tools changed", explanation
    assert explanation["divergence"]["token_position"] > 0


def test_a_grammar_changes_no_other_row(client) -> None:
    """A free request decoded in the same batched steps as constrained ones gets the tokens it
    gets alone: the mask touches its own row only."""
    plain = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "A story."}],
        "max_tokens": 40,
        "temperature": 0,
    }
    alone = client.chat.completions.create(**plain).choices[0].message.content
    form = {"type": "json_object"}
    with ThreadPoolExecutor(3) as pool:
        others = [
            pool.submit(
                client.chat.completions.create,
                model="tiny",
                messages=USER,
                response_format=form,
                seed=i,
                max_tokens=60,
            )
            for i in range(2)
        ]
        together = pool.submit(client.chat.completions.create, **plain)
        assert all(o.result().choices[0].message.content for o in others)
    assert together.result().choices[0].message.content == alone


def test_tokenize_and_prewarm_render_tools_as_chat_does(cached) -> None:
    """``/tokenize`` and ``/v1/cache/prewarm`` with ``tools`` give the chat's prompt: the count
    is its ``prompt_tokens`` and a prewarmed agent prompt is a hit on its first request."""
    base = cached.server.base_url
    fields = {"messages": USER, "tools": [WEATHER, TIME]}
    counted = httpx.post(f"{base}/tokenize", json={"model": "tiny"} | fields, timeout=60).json()["count"]
    warmed = httpx.post(f"{base}/v1/cache/prewarm", json=fields, timeout=300)
    assert warmed.status_code == 200, warmed.text
    cached.flush()
    reply = post(cached, {"model": "tiny", "max_tokens": 2} | fields).json()
    assert reply["usage"]["prompt_tokens"] == counted
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == counted - 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_short_is_the_same_streamed_or_not(client, stream) -> None:
    """``max_tokens`` mid-call: ``finish_reason`` length, the call so far as a call (never the
    generic format's wrapper as text), the same streamed and not."""
    kwargs = REQUIRED
    full = client.chat.completions.create(**kwargs, max_tokens=200)
    cut = full.usage.completion_tokens - 3  # inside the arguments
    whole = client.chat.completions.create(**kwargs, max_tokens=cut).choices[0]
    assert whole.finish_reason == "length" and not whole.message.content
    (call,) = whole.message.tool_calls
    if stream:
        chunks = list(client.chat.completions.create(**kwargs, max_tokens=cut, stream=True))
        arguments = "".join(
            c.function.arguments or "" for ch in chunks for c in ch.choices[0].delta.tool_calls or []
        )
        assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)
        assert arguments == call.function.arguments and chunks[-1].choices[0].finish_reason == "length"
