"""The Responses API as Codex CLI sends it, through the official ``openai`` client on the tiny
model: namespace tools (flattened for the model, calls reported in their namespace), hosted tools
the server cannot run (left out, named in a warning header), every item an agent keeps in its
history (a tool result without ``call_id``, reasoning, other kinds of calls), and an answer the
context window ends (``context_length_exceeded``, what Codex compacts on)."""

from __future__ import annotations

import dataclasses
import json

import httpx
import openai
import pytest
from openai import OpenAI

from tests.api import Api
from tests.helpers import wait_for

GREEDY = {"model": "tiny", "temperature": 0}
SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Start an agent on a task",
    # NOTE: the tiny model is random: a bounded string lets the grammar end every call
    "parameters": {
        "type": "object",
        "properties": {"message": {"type": "string", "maxLength": 12}},
        "required": ["message"],
        "additionalProperties": False,
    },
}
AGENTS = {"type": "namespace", "name": "multi_agent", "description": "Agents", "tools": [SPAWN]}
HOSTED = [
    {"type": "web_search", "external_web_access": False},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "image_generation"},
    {"type": "custom", "name": "apply_patch", "description": "Patch files", "format": {"type": "text"}},
]
HISTORY = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "start the task"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
    {"type": "custom_tool_call", "call_id": "ct_1", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "patched"},
    {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "sh_1",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    },
    {"type": "local_shell_call_output", "id": "sh_1", "output": "README.md"},
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "x"},
    },
    {"type": "compaction", "encrypted_content": "gAAAA"},
    {
        "type": "function_call_output",
        "name": "update_goal",
        "namespace": "goals",
        "output": "goal: tests pass",
    },
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
]


def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)


def test_namespace_functions_are_called_in_their_namespace(cached) -> None:
    """A namespace's function is offered to the model; its call comes back as the hosted API
    writes it (``name`` the function's own, ``namespace`` beside it), streamed or not, and sent
    back with its output it continues the conversation from the cache."""
    api = client(cached.server)
    first = api.responses.create(
        **GREEDY, max_output_tokens=200, input="start an agent", tools=[AGENTS], tool_choice="required"
    )
    call = first.output[-1]
    assert (call.type, call.name, call.namespace) == ("function_call", "spawn_agent", "multi_agent")
    assert "message" in json.loads(call.arguments)
    assert first.tools[0].type == "namespace" and first.tools[0].tools[0].name == "spawn_agent"
    Api(cached.server).flush()
    second = api.responses.create(
        **GREEDY,
        max_output_tokens=12,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "agent 7 started"}],
        tools=[AGENTS],
        tool_choice="none",
    )
    assert second.output[0].type == "message"
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    events = list(
        api.responses.create(
            **GREEDY,
            max_output_tokens=200,
            input="start another",
            tools=[AGENTS],
            tool_choice="required",
            stream=True,
        )
    )
    added = [
        e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"
    ]
    done = [
        e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]
    assert [(i.name, i.namespace) for i in added + done] == [("spawn_agent", "multi_agent")] * 2
    assert events[-1].response.output[-1].namespace == "multi_agent"


def test_allowed_tools_call_only_the_functions_listed(cached) -> None:
    """``tool_choice: {type: allowed_tools}``: the answer calls only a listed function (a
    namespaced one by its name and namespace; hosted tools listed are left out with the tools), and
    the prompt holds every tool, so it stays the prompt of every other choice."""
    api = client(cached.server)
    echo = {**SPAWN, "name": "echo"}
    listed = [{"type": "function", "name": "spawn_agent", "namespace": "multi_agent"}, {"type": "web_search"}]
    choice = {"type": "allowed_tools", "mode": "required", "tools": listed}
    tools = [echo, AGENTS, *HOSTED[:1]]
    for words in ("start", "begin the task", "go"):
        reply = api.responses.create(
            **GREEDY, max_output_tokens=200, input=words, tools=tools, tool_choice=choice
        )
        calls = [i for i in reply.output if i.type == "function_call"]
        assert calls and {(c.name, c.namespace) for c in calls} == {("spawn_agent", "multi_agent")}
    every = api.responses.create(**GREEDY, max_output_tokens=1, input="go", tools=tools)
    assert reply.usage.input_tokens == every.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as err:
        api.responses.create(**GREEDY, input="start", tools=tools, tool_choice=choice | {"tools": listed[1:]})
    assert err.value.body["param"] == "tool_choice"


@pytest.mark.parametrize(
    "listed",
    [
        [1],
        [{"type": "function"}],
        [{"type": "function", "name": 5}],
        ["x", {"type": "function", "name": "echo"}],
    ],
)
@pytest.mark.parametrize("mode", ["auto", "required"])
def test_allowed_tools_of_another_shape_are_refused(cached, listed, mode) -> None:
    """An ``allowed_tools`` entry that is not a tool's type and name, or a ``mode`` other than
    ``auto``/``required``, is a 400 naming ``tool_choice`` in the Responses shape."""
    echo = {**SPAWN, "name": "echo"}
    for choice in (
        {"type": "allowed_tools", "mode": mode, "tools": listed},
        {"type": "allowed_tools", "tools": []},
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client(cached.server).responses.create(**GREEDY, input="go", tools=[echo], tool_choice=choice)
        assert err.value.body["param"] == "tool_choice" and "{type: function, name}" in err.value.message


def test_allowed_tools_may_list_many_tools(cached) -> None:
    """An ``allowed_tools`` choice longer than a short echo field (2,048 characters as JSON: tools
    of 64-character names, one in a namespace, and hosted tools, left out) is served: its bound is
    that of every tool a request may define."""
    names = [f"t{i:02d}_{'x' * 60}" for i in range(12)]
    many = [
        {"type": "function", "name": n, "parameters": {"type": "object", "properties": {}}} for n in names
    ]
    namespace = {**AGENTS, "name": "n" * 30}
    listed = [{"type": "function", "name": n} for n in names]
    listed += [{"type": "function", "name": "spawn_agent", "namespace": "n" * 30}, *[HOSTED[0]] * 60]
    choice = {"type": "allowed_tools", "mode": "auto", "tools": listed}
    assert len(json.dumps(choice, separators=(",", ":"))) > 2048
    reply = client(cached.server).responses.create(
        **GREEDY, max_output_tokens=1, input="go", tools=[*many, namespace, HOSTED[0]], tool_choice=choice
    )
    assert reply.usage.input_tokens > 0


def test_namespaced_call_in_history_reads_as_generated(cached) -> None:
    """A ``function_call`` item sent back with its ``namespace`` renders as the model saw the
    function (its flat name): the same prompt as the conversation continued by id."""
    api = client(cached.server)
    first = api.responses.create(
        **GREEDY, max_output_tokens=200, input="start an agent", tools=[AGENTS], tool_choice="required"
    )
    call = first.output[-1]
    sent_back = [
        {"role": "user", "content": "start an agent"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "namespace": call.namespace,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "agent 7 started"},
    ]
    whole = api.responses.create(**GREEDY, max_output_tokens=4, input=sent_back, tools=[AGENTS], store=False)
    continued = api.responses.create(
        **GREEDY,
        max_output_tokens=4,
        previous_response_id=first.id,
        input=sent_back[2:],
        tools=[AGENTS],
        store=False,
    )
    assert whole.usage.input_tokens == continued.usage.input_tokens
    assert whole.output_text == continued.output_text


def test_hosted_tools_are_left_out_with_a_warning(cached) -> None:
    """Hosted and custom tools (``web_search`` with ``external_web_access: false`` as Codex sends
    it, ...) are not offered: the prompt is the one with the function tools alone, and the
    ``x-kvproxy-warning`` header names each kind left out, streamed or not."""
    api = client(cached.server)
    kwargs = {**GREEDY, "max_output_tokens": 4, "input": "hello", "store": False}
    raw = api.responses.with_raw_response.create(**kwargs, tools=[*HOSTED, SPAWN])
    warning = raw.headers["x-kvproxy-warning"]
    assert all(kind in warning for kind in ("web_search", "file_search", "image_generation", "custom"))
    alone = api.responses.create(**kwargs, tools=[SPAWN])
    assert raw.parse().usage.input_tokens == alone.usage.input_tokens
    assert raw.parse().output_text == alone.output_text
    only_hosted = api.responses.create(**kwargs, tools=HOSTED[:1])
    assert only_hosted.usage.input_tokens == api.responses.create(**kwargs).usage.input_tokens
    with api.responses.with_streaming_response.create(**kwargs, tools=HOSTED[:1], stream=True) as streamed:
        assert "web_search" in streamed.headers["x-kvproxy-warning"]
    assert "x-kvproxy-warning" not in api.responses.with_raw_response.create(**kwargs, tools=[SPAWN]).headers


@pytest.mark.parametrize(
    ("tools", "choice", "said"),
    [
        (HOSTED, {"type": "web_search"}, "a tool of type `web_search`, which this server cannot run"),
        ([*HOSTED[:1], SPAWN], {"type": "custom", "name": "apply_patch"}, "a tool of type `custom`"),
        (HOSTED, "required", "tools left out, this server cannot run them: web_search"),
    ],
)
def test_a_choice_of_a_tool_left_out_says_so(cached, tools, choice, said) -> None:
    """A tool choice that can only be met by a tool the server leaves out (a hosted tool's, or
    ``required`` with hosted tools alone) is a 400 on ``tool_choice`` that says why."""
    with pytest.raises(openai.BadRequestError) as err:
        client(cached.server).responses.create(**GREEDY, input="hi", tools=tools, tool_choice=choice)
    assert err.value.body["param"] == "tool_choice" and said in err.value.body["message"]


@pytest.mark.parametrize(("instructions", "param"), [("You help.", "instructions"), (None, "input")])
def test_client_metadata_is_named_as_the_request_names_it(cached, instructions, param) -> None:
    """Claude Code's billing header at the start of the instructions, or of a system message in
    ``input``, is left out and the explanation names that field (not the chat's
    ``messages[0]``)."""
    billing = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli;"
    system = {"type": "message", "role": "system", "content": billing + " Be brief."}
    body = {**GREEDY, "max_output_tokens": 1, "store": False, "input": [system, HISTORY[0]]}
    if instructions is not None:
        body |= {"instructions": billing + instructions, "input": [HISTORY[0]]}
    explained = httpx.post(
        f"{cached.server.base_url}/v1/responses", json=body, headers={"x-kvproxy-explain": "1"}, timeout=120
    ).json()
    left_out = [{"rule": "claude-code-billing-header", "param": param}]
    assert explained["kvproxy_cache_explanation"]["left_out"] == left_out


def test_every_item_an_agent_keeps_is_accepted_and_resumes(cached) -> None:
    """A history holding a result without ``call_id`` (Codex's goals), reasoning, compaction, a
    hosted search, custom and local shell calls with their results is served, each item listed
    as sent, and resuming the conversation works (the session is not dead); the result without
    ``call_id`` is in the prompt."""
    api = client(cached.server)
    first = api.responses.create(**GREEDY, max_output_tokens=4, input=HISTORY)
    listed = api.responses.input_items.list(first.id, order="asc")
    assert [i.type for i in listed.data] == [item["type"] for item in HISTORY]
    goal = listed.data[-2]
    assert (goal.name, goal.namespace, goal.output) == ("update_goal", "goals", "goal: tests pass")
    Api(cached.server).flush()
    resumed = api.responses.create(**GREEDY, max_output_tokens=4, previous_response_id=first.id, input="more")
    assert resumed.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    without_goal = [item for item in HISTORY if item["type"] != "function_call_output"]
    shorter = api.responses.create(**GREEDY, max_output_tokens=4, input=without_goal, store=False)
    assert shorter.usage.input_tokens < first.usage.input_tokens


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
        ({"type": "custom_tool_call_output", "call_id": "nope", "output": "x"}, "input[0].call_id"),
        ({"type": "custom_tool_call", "name": "apply_patch", "input": "x"}, "input[0].call_id"),
        ({"type": "no_such_item"}, "input[0].type"),
    ],
)
def test_malformed_history_items_name_the_field(cached, item, param) -> None:
    """An item the API itself would refuse (a result answering nothing and naming no tool, a
    call without its id, an unknown type) is still a 400 naming the field."""
    with pytest.raises(openai.BadRequestError) as err:
        client(cached.server).responses.create(**GREEDY, input=[item])
    assert err.value.body["param"] == param


@pytest.mark.parametrize("arguments", ['{"path": "calc.py", "text": "def ad', "not json at all"])
def test_a_call_cut_short_in_the_history_is_kept(cached, arguments) -> None:
    """A ``function_call`` whose arguments are not JSON (an answer cut short at its token limit,
    which Codex keeps in its history and sends again on ``resume``) is rendered as its text,
    in the Responses API and in chat completions: the conversation goes on (before: a 400 on
    every later request, the session dead)."""
    call = {"type": "function_call", "call_id": "c1", "name": "write_file", "arguments": arguments}
    output = {"type": "function_call_output", "call_id": "c1", "output": "cut short"}
    items = [HISTORY[0], call, output, HISTORY[-1]]
    answer = client(cached.server).responses.create(**GREEDY, max_output_tokens=2, input=items, store=False)
    assert answer.status == "incomplete" and answer.usage.input_tokens > 0
    chat_call = {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "start the task"},
        {"role": "assistant", "content": None, "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": "c1", "content": "cut short"},
    ]
    chat = client(cached.server).chat.completions.create(**GREEDY, max_tokens=2, messages=messages)
    assert chat.usage.prompt_tokens > 0


LONG_CALL = {
    "type": "function",
    "name": "write_file",
    "description": "Write a file",
    # NOTE: a string the grammar keeps open for longer than the window: the window ends the answer
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 4000}},
        "required": ["text"],
    },
}


def test_a_call_cut_short_is_an_incomplete_item(cached) -> None:
    """An answer cut short inside a call (``max_output_tokens``): the response and its last
    ``function_call`` item are ``incomplete``, streamed and not (the item's arguments are not
    JSON; before: the item said ``completed``)."""
    api = client(cached.server)
    kwargs = {**GREEDY, "max_output_tokens": 8, "input": "write", "store": False}
    whole = api.responses.create(**kwargs, tools=[LONG_CALL], tool_choice="required")
    assert whole.status == "incomplete" and [i.status for i in whole.output] == ["incomplete"]
    events = list(api.responses.create(**kwargs, tools=[LONG_CALL], tool_choice="required", stream=True))
    assert events[-1].type == "response.incomplete"
    assert [i.status for i in events[-1].response.output] == ["incomplete"]


def test_a_long_call_cut_short_is_reused_whole_on_the_next_turn(cached) -> None:
    """A call cut short after hundreds of tokens, sent back as Codex keeps it (its arguments, not
    JSON, rendered as a string: not the tokens the model wrote): render-ahead computes that
    rendering in idle steps, a chunk each, so the next turn computes only its new message (before:
    a start more than 256 tokens from the cache was skipped, and the whole call was recomputed)."""
    api, ahead = client(cached.server), cached.engine.ahead
    kwargs = {**GREEDY, "tools": [LONG_CALL], "store": False}
    submitted, computed = ahead.submitted, ahead.computed
    first = api.responses.create(**kwargs, max_output_tokens=400, input="write", tool_choice="required")
    assert first.status == "incomplete" and first.output[-1].type == "function_call"
    # NOTE: the start is handed over once the answer is out, on a worker thread
    wait_for(lambda: ahead.submitted > submitted and ahead.settled, what="render-ahead to settle")
    assert ahead.computed == computed + 1
    Api(cached.server).flush()
    call = first.output[-1].model_dump(exclude_none=True)
    history = [{"role": "user", "content": "write"}, call, {"role": "user", "content": "go on"}]
    second = api.responses.create(**kwargs, max_output_tokens=2, input=history)
    new_turn = second.usage.input_tokens - second.usage.input_tokens_details.cached_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + 400 and new_turn < 32, second.usage


def test_context_window_end_is_context_length_exceeded(settings, tiny_model, serve) -> None:
    """An answer the context window ends, with no ``max_output_tokens`` set, is reported as the
    hosted API reports a conversation past the window: streamed, an ``error`` event and
    ``response.failed`` with ``error.code`` ``context_length_exceeded`` (what Codex compacts on;
    the call cut short never reported done);
    not streamed, a 400 with that code. The server's ``--default-max-tokens`` does not end it (the
    hosted API has no such cap; an ``incomplete`` answer fails Codex's turn). With
    ``max_output_tokens`` set it stays ``incomplete``."""
    model = dataclasses.replace(tiny_model, context_length=640)
    kwargs = {**GREEDY, "input": "write it", "tools": [LONG_CALL], "tool_choice": "required"}
    with serve(settings.model_copy(update={"default_max_tokens": 16}), model) as server:
        api = client(server)
        stream = httpx.post(f"{server.base_url}/v1/responses", json={**kwargs, "stream": True}, timeout=600)
        events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
        assert events[-2]["error"]["code"] == "context_length_exceeded"
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
        assert failed["usage"]["input_tokens"] + failed["usage"]["output_tokens"] == 640
        assert not [e for e in events if e["type"] == "response.output_item.done"]
        with pytest.raises(openai.APIError) as streamed:  # NOTE: the SDK raises the error event
            list(api.responses.create(**kwargs, stream=True))
        assert streamed.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as err:
            api.responses.create(**kwargs)
        assert err.value.code == "context_length_exceeded" and err.value.body["param"] == "input"
        bounded = api.responses.create(**kwargs, max_output_tokens=8)
        assert bounded.status == "incomplete" and bounded.incomplete_details.reason == "max_output_tokens"
