"""Anthropic's Messages API as coding agents send it today (Claude Code 2.1's shapes), with the
official ``anthropic`` client on the tiny model over real HTTP: a ``system`` message inside
``messages`` is rendered at its place (its breakpoints honoured, the prompt of a turn a prefix of
the next one's), thinking settings are satisfied by an answer without thinking blocks (their
shapes checked as the hosted API checks them), an assistant's thinking blocks in the history are
accepted and not rendered, and a tool whose schema uses a keyword the grammar cannot enforce
(``propertyNames``) is served with a warning header, unless it is ``strict``."""

from __future__ import annotations

import dataclasses
import json

import anthropic
import httpx
import pytest

from engine.model.loading import LoadedModel, load_model
from proxy.http.warnings import WARNING_HEADER
from tests.helpers import build_tiny_model
from tests.replicas import text

BETA = "mid-conversation-system-2026-04-07"
"""The beta Claude Code announces when it sends ``system`` messages inside ``messages``."""
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli;"},
    {"type": "text", "text": "You are Claude Code, a coding agent. " + text(3, 60)},
    {
        "type": "text",
        "text": "Work in the repository. " + text(4, 200),
        "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"},
    },
]
"""A system prompt shaped like Claude Code's: the billing block, the identity, the instructions
with its breakpoint (an hour, with the ``scope`` Claude Code adds)."""
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
    "cache_control": {"type": "ephemeral", "ttl": "1h"},
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
        metadata={"user_id": "user_abc_account_def_session_0123"},
        extra_headers={"anthropic-beta": f"claude-code-20250219,{BETA}"},
        extra_body={"temperature": 0},
        **(
            {"tools": [AGENT, READ], "thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"}}
            | fields
        ),
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
    with client(cached.server).messages.stream(
        model="tiny",
        max_tokens=8,
        system=SYSTEM,
        messages=[USER, REMINDER],
        tools=[AGENT, READ],
        thinking={"type": "adaptive"},
        extra_headers={"anthropic-beta": BETA},
    ) as stream:
        streamed = stream.get_final_message()
        assert stream.response.headers[WARNING_HEADER] == warning
    assert all(block.type in ("text", "tool_use") for block in streamed.content)


def chatml_ids(tiny_model, messages: list[dict], generation_prompt: bool = True) -> list[int]:
    """The ids the tiny model's ChatML template gives ``messages`` (OpenAI's shape, no tools)."""
    tokenizer = tiny_model.tokenizer
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


QUESTION = "Tell me about the prefix cache. " + text(7, 120)  # about 200 tokens: a full block
NOTE = "From now on answer in one sentence. " + text(8, 40)


def test_a_system_message_is_rendered_at_its_place_and_the_next_turn_reads_it(cached, tiny_model) -> None:
    """``[user, system]``: the prompt is the template's rendering of those two messages, the
    system one where it stands (count_tokens and usage agree); the next turn (the answer and a
    new question after them) reads all of that prompt from the cache: it is a prefix of the
    next turn's."""
    sdk = client(cached.server)
    first = [{"role": "user", "content": QUESTION}, {"role": "system", "content": NOTE}]
    ids = chatml_ids(tiny_model, first)
    assert sdk.messages.count_tokens(model="tiny", messages=first).input_tokens == len(ids)
    reply = sdk.messages.create(model="tiny", max_tokens=8, messages=first, extra_body={"temperature": 0})
    assert reply.usage.input_tokens + reply.usage.cache_creation_input_tokens == len(ids)
    cached.flush()
    answer = {"role": "assistant", "content": reply.content[0].text or "ok"}
    second = sdk.messages.create(
        model="tiny",
        max_tokens=4,
        messages=[*first, answer, {"role": "user", "content": "And why?"}],
        extra_body={"temperature": 0},
    )
    assert second.usage.cache_read_input_tokens >= len(ids)


def test_a_breakpoint_on_a_system_message_is_honoured(cached, tiny_model) -> None:
    """A ``cache_control`` mark on a mid-conversation system message's block stores the prompt to
    the end of that message: another conversation sharing the history up to it, not after, reads
    that many tokens, and the few after it the two still share (the assistant turn's start: a tail
    serves every token a prompt shares with it)."""
    sdk = client(cached.server)
    marked = {"type": "text", "text": NOTE, "cache_control": {"type": "ephemeral"}}
    head = [{"role": "user", "content": QUESTION}, {"role": "system", "content": [marked]}]
    rendered = []
    for after in ("Fine, go on.", "No, stop there and summarise in three words."):
        messages = [*head, {"role": "assistant", "content": after}, {"role": "user", "content": text(9, 20)}]
        plain = [{"role": "user", "content": QUESTION}, {"role": "system", "content": NOTE}, *messages[2:]]
        rendered.append(chatml_ids(tiny_model, plain))
        reply = sdk.messages.create(
            model="tiny", max_tokens=4, messages=messages, extra_body={"temperature": 0}
        )
        cached.flush()
    to_mark = chatml_ids(
        tiny_model, [{"role": "user", "content": QUESTION}, {"role": "system", "content": NOTE}], False
    )
    shared = next(i for i, (a, b) in enumerate(zip(*rendered, strict=False)) if a != b)
    assert rendered[0][: len(to_mark)] == to_mark and len(to_mark) <= shared
    assert reply.usage.cache_read_input_tokens == shared


def test_thinking_blocks_in_the_history_are_accepted_and_not_rendered(cached, tiny_model) -> None:
    """An assistant turn holding ``thinking`` and ``redacted_thinking`` blocks before its text is
    rendered as its text alone (as the hosted API drops earlier turns' thinking)."""
    assistant = [
        {"type": "thinking", "thinking": "The user wants a list.", "signature": "c2lnbmF0dXJl"},
        {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
        {"type": "text", "text": "Here is the list."},
    ]
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": "Thanks."},
    ]
    plain = [messages[0], {"role": "assistant", "content": "Here is the list."}, messages[2]]
    sdk = client(cached.server)
    counted = sdk.messages.count_tokens(model="tiny", messages=messages, thinking={"type": "adaptive"})
    assert counted.input_tokens == len(chatml_ids(tiny_model, plain))
    reply = sdk.messages.create(model="tiny", max_tokens=4, messages=messages, thinking={"type": "adaptive"})
    assert all(block.type != "thinking" for block in reply.content)


BASE = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("fields", "status", "named"),
    [
        ({"thinking": {"type": "adaptive"}}, 200, None),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, 200, None),
        ({"thinking": {"type": "disabled"}}, 200, None),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1025}, 200, None),
        ({"output_config": {"effort": "max"}}, 200, None),
        ({"thinking": {"type": "sometimes"}}, 400, "thinking.type"),
        ({"thinking": "adaptive"}, 400, "thinking"),
        ({"thinking": {"type": "adaptive", "display": "full"}}, 400, "thinking.display"),
        ({"thinking": {"type": "enabled"}}, 400, "thinking.budget_tokens"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1023}, "max_tokens": 4096},
            400,
            "thinking.budget_tokens",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": "2048"}}, 400, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048}, 400, "max_tokens"),
        ({"output_config": {"effort": "extreme"}}, 400, "output_config.effort"),
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
            400,
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": ""}]},
            400,
            "messages[1].content",
        ),
        (
            {"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]},
            400,
            "messages[0].content[0].type",
        ),
    ],
)
def test_thinking_settings_are_checked_as_the_hosted_api_checks_them(cached, fields, status, named) -> None:
    """Thinking of every accepted shape is answered without thinking blocks; a wrong shape (an
    unknown type or display, a budget below 1,024, not an integer, or not below ``max_tokens``,
    an unknown effort, thinking in a user turn, an empty or non-text system message) is a 400 in
    Anthropic's shape naming the field."""
    r = httpx.post(f"{cached.server.base_url}/v1/messages", json=BASE | fields, timeout=120)
    assert r.status_code == status, r.text
    if status == 200:
        assert {block["type"] for block in r.json()["content"]} <= {"text"}
    else:
        doc = r.json()
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert named in doc["error"]["message"]


def test_a_strict_tool_with_a_keyword_the_grammar_cannot_enforce_is_refused(cached) -> None:
    """A ``strict`` tool is enforced in full or not served: ``propertyNames`` in its schema is a
    400 naming the field and the keyword; the same tool not strict is answered with a warning,
    and a strict tool the grammar enforces in full carries none."""
    sdk = client(cached.server)
    with pytest.raises(anthropic.BadRequestError) as refused:
        agent_request(sdk, [USER], tools=[AGENT | {"strict": True}, READ])
    message = refused.value.body["error"]["message"]
    assert "tools[0].input_schema" in message and "propertyNames" in message
    raw = agent_request(sdk, [USER], tools=[READ | {"strict": True}])
    assert WARNING_HEADER not in raw.headers
    with pytest.raises(anthropic.BadRequestError) as refused:
        agent_request(sdk, [USER], tools=[READ | {"strict": "yes"}])
    assert "tools[0].strict" in refused.value.body["error"]["message"]


def test_a_final_assistant_turn_of_thinking_only_is_no_prefill(cached, tiny_model) -> None:
    """A final assistant turn that holds only a thinking block renders nothing: the answer is a
    new turn, as after an empty final assistant turn."""
    thinking = [{"type": "thinking", "thinking": "Let me see.", "signature": "c2ln"}]
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": thinking}]
    counted = client(cached.server).messages.count_tokens(model="tiny", messages=messages)
    assert counted.input_tokens == len(chatml_ids(tiny_model, messages[:1]))


VERDICT = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "reason": {"type": "string", "maxLength": 8}},
    "required": ["answer", "reason"],
    "additionalProperties": False,
}


def test_structured_output_is_decoded_under_its_schema(cached) -> None:
    """``output_config.format`` (and the older ``output_format``) is honoured: the answer's text is
    one JSON value of the schema, its effort beside it changing nothing."""
    sdk = client(cached.server)
    question = [{"role": "user", "content": "Is the cache warm?"}]
    for fields in (
        {"output_config": {"format": {"type": "json_schema", "schema": VERDICT}, "effort": "low"}},
        {"extra_body": {"output_format": {"type": "json_schema", "schema": VERDICT}}},
    ):
        reply = sdk.messages.create(model="tiny", max_tokens=40, messages=question, **fields)
        value = json.loads(reply.content[0].text)
        assert set(value) == {"answer", "reason"} and value["answer"] in ("yes", "no")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"output_config": {"format": {"type": "text"}}}, "output_config.format.type"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        (
            {
                "output_config": {"format": {"type": "json_schema", "schema": VERDICT}},
                "output_format": {"type": "json_schema", "schema": VERDICT},
            },
            "output_format",
        ),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": VERDICT}}, "tools": [READ]},
            "output_config.format",
        ),
        (
            {
                "output_config": {"format": {"type": "json_schema", "schema": VERDICT}},
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}],
            },
            "output_config.format",
        ),
        (
            {
                "output_config": {
                    "format": {"type": "json_schema", "schema": AGENT["input_schema"]},
                }
            },
            "propertyNames",
        ),
    ],
)
def test_a_structured_output_that_cannot_be_honoured_is_refused(cached, fields, named) -> None:
    """A format that is not a JSON schema, both spellings at once, a format with tools or after
    a prefill, a schema keyword the grammar cannot enforce (structured outputs are strict): a 400
    in Anthropic's shape naming it."""
    r = httpx.post(f"{cached.server.base_url}/v1/messages", json=BASE | fields, timeout=120)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


SYSTEM_FIRST_ONLY = (
    "{% for message in messages %}{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System role only at the beginning') }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML that allows a system message only first (as some models' templates do)."""


@pytest.fixture(scope="module")
def system_first_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = build_tiny_model(tmp_path_factory.mktemp("system-first"), chat_template=SYSTEM_FIRST_ONLY)
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    return dataclasses.replace(loaded, name="tiny")


def test_a_template_that_cannot_place_a_system_message_gets_the_hosted_refusal(
    settings, system_first_model, serve
) -> None:
    """On a model whose template takes a system message only first, a system message inside the
    conversation is a 400 in the hosted API's words for that role (``Unexpected role "system"``,
    ``input message role``: Claude Code then resends the instruction as user text), on
    ``/v1/messages`` and ``count_tokens``; a body without one is served as usual."""
    with serve(settings, system_first_model) as server:
        sdk = client(server)
        for call in (sdk.messages.create, sdk.messages.count_tokens):
            extra = {"max_tokens": 4} if call == sdk.messages.create else {}
            with pytest.raises(anthropic.BadRequestError) as refused:
                call(model="tiny", messages=[USER, REMINDER], **extra)
            message = refused.value.body["error"]["message"]
            assert "Unexpected role" in message and "input message role" in message
            assert "System role only at the beginning" in message
        reply = sdk.messages.create(model="tiny", max_tokens=4, system=SYSTEM, messages=[USER])
        assert reply.usage.output_tokens > 0
