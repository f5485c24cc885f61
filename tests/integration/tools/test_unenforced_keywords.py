"""Schema keywords the grammar cannot enforce (llguidance's unimplemented ones: ``propertyNames``,
``not``, ``if``/``then``, ``uniqueItems``, ``contains``, ``dependentRequired``, an unknown
``format``, ...), in every dialect that takes tools (chat completions, Responses, Messages), with
the official clients on the tiny model: a tool that is not ``strict`` is served, its grammar
without the keyword (wider: every value the schema allows still is), and the response says so in
``x-kvproxy-warning`` naming the tool and the keyword; a ``strict`` tool is a 400 naming the
keyword.

NOTE: the tiny model is random, so its strings would run to ``max_tokens``; the schemas bound
them (the grammar then ends every answer)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from proxy.http.warnings import WARNING_HEADER

UNENFORCED = {
    "propertyNames": {"type": "object", "propertyNames": {"type": "string"}, "maxProperties": 0},
    "not": {"type": "integer", "minimum": 0, "maximum": 9, "not": {"const": 3}},
    "uniqueItems": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 2, "uniqueItems": True},
    "contains": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 2, "contains": {"const": 1}},
    "if": {"type": "integer", "minimum": 0, "maximum": 9, "if": {"minimum": 5}, "then": {"maximum": 7}},
}
"""A property per keyword, each bounded by keywords the grammar does enforce."""


def parameters(keywords: dict[str, Any]) -> dict[str, Any]:
    """An object schema with one required property per entry of ``keywords``."""
    return {
        "type": "object",
        "properties": keywords,
        "required": list(keywords),
        "additionalProperties": False,
    }


def named_keywords(warning: str) -> list[str]:
    """The keywords a warning header names, in order."""
    return [part.split("schema keyword ")[1].split(" is not")[0].strip('"') for part in warning.split("; ")]


def test_chat_a_non_strict_tool_is_served_with_a_warning_naming_each_keyword(cached) -> None:
    """A forced call of a tool whose schema uses five keywords llguidance does not implement is
    answered: its arguments are a JSON object with every required property, of the enforced
    types and bounds; the header names the tool and each keyword once (``if`` with its
    ``then``), streamed and not."""
    tool = {"type": "function", "function": {"name": "pick", "parameters": parameters(UNENFORCED)}}
    sdk = OpenAI(base_url=f"{cached.server.base_url}/v1", api_key="unused", max_retries=0)
    fields = {"model": "tiny", "messages": [{"role": "user", "content": "pick"}], "tools": [tool]}
    raw = sdk.chat.completions.with_raw_response.create(
        **fields, tool_choice="required", max_tokens=200, temperature=0
    )
    call = raw.parse().choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == set(UNENFORCED) and arguments["propertyNames"] == {}
    assert 0 <= arguments["not"] <= 9 and set(arguments["uniqueItems"]) <= {1, 2}
    warning = raw.headers[WARNING_HEADER]
    assert warning.startswith('tools[0].function.parameters (tool "pick"): schema keyword ')
    assert sorted(named_keywords(warning)) == sorted(
        ["propertyNames", "not", "uniqueItems", "contains", "if", "then"]
    )
    with httpx.stream(
        "POST",
        f"{cached.server.base_url}/v1/chat/completions",
        json=fields | {"stream": True, "max_tokens": 2},
    ) as streamed:
        assert streamed.status_code == 200 and streamed.headers[WARNING_HEADER] == warning
        streamed.read()


def test_an_unknown_format_is_named_and_a_fully_enforced_tool_has_no_warning(cached) -> None:
    """An unknown ``format`` is left out as a keyword is (named with its value); a request whose
    tools the grammar enforces in full carries no warning header."""
    odd = {
        "type": "function",
        "function": {
            "name": "odd",
            "parameters": parameters({"x": {"type": "string", "maxLength": 3, "format": "color"}}),
        },
    }
    plain = {
        "type": "function",
        "function": {"name": "plain", "parameters": parameters({"x": {"type": "string", "maxLength": 3}})},
    }
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(
        f"{cached.server.base_url}/v1/chat/completions", json=body | {"tools": [plain, odd]}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert (
        r.headers[WARNING_HEADER]
        == 'tools[1].function.parameters (tool "odd"): schema keyword "format: color" is not enforced'
    )
    r = httpx.post(
        f"{cached.server.base_url}/v1/chat/completions", json=body | {"tools": [plain]}, timeout=120
    )
    assert r.status_code == 200 and WARNING_HEADER not in r.headers


@pytest.mark.parametrize("keyword", sorted(UNENFORCED))
def test_chat_a_strict_tool_is_refused_naming_the_keyword(cached, keyword) -> None:
    """OpenAI's ``strict: true`` asks for the schema in full: a keyword the grammar cannot enforce
    is a 400 in OpenAI's shape naming the tool's parameters and the keyword."""
    function = {"name": "pick", "strict": True, "parameters": parameters({keyword: UNENFORCED[keyword]})}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(
        f"{cached.server.base_url}/v1/chat/completions",
        json=body | {"tools": [{"type": "function", "function": function}]},
        timeout=120,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools[0].function.parameters" and keyword in error["message"]


def test_responses_and_messages_serve_a_non_strict_tool_and_refuse_a_strict_one(cached) -> None:
    """The same kind through Responses (a function tool with ``strict: false``, as Codex sends it)
    and Messages (a custom tool without ``strict``): served with the warning naming the tool and
    ``propertyNames``; ``strict: true`` in either is a 400 naming the keyword."""
    schema = parameters({"env": UNENFORCED["propertyNames"]})
    base = cached.server.base_url
    responses = {"model": "tiny", "input": "hi", "max_output_tokens": 2, "store": False}
    tool = {"type": "function", "name": "Bash", "parameters": schema}
    r = httpx.post(
        f"{base}/v1/responses", json=responses | {"tools": [tool | {"strict": False}]}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert (
        r.headers[WARNING_HEADER]
        == 'tools[0].parameters (tool "Bash"): schema keyword "propertyNames" is not enforced'
    )
    r = httpx.post(f"{base}/v1/responses", json=responses | {"tools": [tool | {"strict": True}]}, timeout=120)
    assert r.status_code == 400 and "propertyNames" in r.json()["error"]["message"]

    sdk = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    messages = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    custom = {"name": "Bash", "input_schema": schema}
    raw = sdk.messages.with_raw_response.create(**messages, tools=[custom])
    assert (
        raw.headers[WARNING_HEADER]
        == 'tools[0].input_schema (tool "Bash"): schema keyword "propertyNames" is not enforced'
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(**messages, tools=[custom | {"strict": True}])
    assert "propertyNames" in refused.value.body["error"]["message"]


def test_a_json_answer_schema_that_is_not_strict_is_served_with_a_warning(cached) -> None:
    """The same kind in an answer's schema: chat's ``json_schema`` and the Responses API's
    ``text.format`` without ``strict: true`` are decoded without the keyword (the answer still a
    JSON object of the enforced shape) and warned of, naming the schema's field; with ``strict:
    true`` they are a 400 naming the keyword."""
    schema = parameters({"env": UNENFORCED["propertyNames"]})
    base = cached.server.base_url
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 40,
        "temperature": 0,
    }
    form = {"type": "json_schema", "json_schema": {"name": "env", "schema": schema}}
    r = httpx.post(f"{base}/v1/chat/completions", json=chat | {"response_format": form}, timeout=120)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"env": {}}
    assert (
        r.headers[WARNING_HEADER]
        == 'response_format.json_schema.schema: schema keyword "propertyNames" is not enforced'
    )
    form["json_schema"]["strict"] = True
    r = httpx.post(f"{base}/v1/chat/completions", json=chat | {"response_format": form}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema.schema"
    assert "propertyNames" in r.json()["error"]["message"]

    responses = {"model": "tiny", "input": "hi", "max_output_tokens": 40, "store": False}
    text = {"format": {"type": "json_schema", "name": "env", "schema": schema, "strict": False}}
    r = httpx.post(f"{base}/v1/responses", json=responses | {"text": text}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers[WARNING_HEADER] == 'text.format.schema: schema keyword "propertyNames" is not enforced'
