"""Hostile and careless schemas and tool lists, on a real server with the tiny model: each kind
(deep, wide, many tools, a long list with a repeated name, deeper than llguidance parses) is a
400 naming the field, in every dialect's own error shape, at once; the largest allowed request
is served; ``/health`` keeps answering while the worst of each is in flight, and no grammar is
compiled on the event loop's thread (checked by where the work runs, not by how long it takes:
the tests never depend on the machine's speed).

Limits: ``proxy.tools.limits`` (docs/operations.md, "Request limits")."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from engine import constraint
from proxy.router.app import create_route_app
from proxy.router.settings import RouteSettings
from tests.conftest import shared_redis_url
from tests.fake_upstream import fake_upstream
from tests.helpers import ServerThread

USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": "tiny", "messages": USER, "max_tokens": 1, "temperature": 0}
MESSAGES = {"model": "tiny", "messages": USER, "max_tokens": 1}
RESPONSES = {"model": "tiny", "input": "hi", "max_output_tokens": 1, "store": False}
JSON_HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
MAX_TOOLS, MAX_DEPTH, MAX_PROPERTIES = 128, 64, 5000
"""The documented limits (``proxy.tools.limits``), written out: the tests hold the server to them."""
BOUND_S = 120.0
"""How long a hostile request may take before the test calls it hung (it should take well under
a second; before the limits, some took minutes)."""


def nested(levels: int) -> dict[str, Any]:
    """An object schema with ``levels`` objects nested in ``properties`` (JSON depth 2n + 1)."""
    schema: dict[str, Any] = {"type": "string", "maxLength": 2}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def arrays(levels: int) -> str:
    """JSON text of an array schema nested ``levels`` deep (as text: ``json.dumps`` recurses)."""
    return '{"type": "array", "items": ' * levels + '{"type": "string"}' + "}" * levels


def wide(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(properties)}}


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}


def function(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name} | ({"parameters": parameters} if parameters else {}),
    }


def health_while(base_url: str, send: Callable[[], httpx.Response]) -> tuple[httpx.Response, list[bool]]:
    """``send()``'s answer, and whether each ``/health`` call made while it was in flight was
    answered 200 (polled from before it starts until it ends; a call that failed or got no
    answer within ``BOUND_S`` counts as False)."""
    done = threading.Event()
    answered: list[bool] = []

    def poll() -> None:
        with httpx.Client(timeout=BOUND_S) as client:
            while not done.is_set():
                try:
                    answered.append(client.get(f"{base_url}/health").status_code == 200)
                except httpx.HTTPError:
                    answered.append(False)
                time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(0.1)  # NOTE: the first polls land before the request, the next while it runs
    try:
        answer = send()
    finally:
        done.set()
        poller.join(BOUND_S)
    return answer, answered


@pytest.fixture
def compiles(monkeypatch) -> list[bool]:
    """Whether each grammar compile (llguidance's tokenizer view, built for every check and
    matcher: ``engine.constraint``) ran on a thread that runs an event loop."""
    on_loop: list[bool] = []
    build = constraint._tokenizer

    def watched(*args: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return build(*args)

    monkeypatch.setattr(constraint, "_tokenizer", watched)
    monkeypatch.setattr(constraint, "_VERDICTS", constraint.Verdicts(max_bytes=1 << 20))  # NOTE: none cached
    return on_loop


@pytest.fixture
def server(settings, tiny_model, serve) -> Iterator[ServerThread]:
    with serve(settings, tiny_model) as running:
        yield running


def post(server: ServerThread, path: str, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(f"{server.base_url}{path}", content=content, headers=JSON_HEADERS, timeout=BOUND_S)


def refused(answer: httpx.Response, param: str, dialect: str = "openai") -> str:
    """The message of a 400 that names ``param`` in ``dialect``'s shape."""
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    if dialect == "anthropic":
        assert answer.json()["type"] == "error" and error["type"] == "invalid_request_error"
        assert param in error["message"], error
    else:
        assert error["param"] == param, error
    return str(error["message"])


# (kind, body allowed at the limit, body over it, the field named)
KINDS = [
    (
        "deep",
        CHAT | {"response_format": strict(nested((MAX_DEPTH - 1) // 2))},
        CHAT | {"response_format": strict(nested(40))},
        "response_format.json_schema.schema",
    ),
    (
        "wide",
        CHAT | {"response_format": strict(wide(MAX_PROPERTIES))},
        CHAT | {"response_format": strict(wide(MAX_PROPERTIES + 1))},
        "response_format.json_schema.schema",
    ),
    (
        "many tools",
        CHAT | {"tools": [function(f"t{i}", wide(MAX_PROPERTIES // 128)) for i in range(128)]},
        CHAT | {"tools": [function(f"t{i}") for i in range(MAX_TOOLS + 1)]},
        "tools",
    ),
    (
        "tools sharing a budget",
        CHAT | {"tools": [function("a", wide(2500)), function("b", wide(2500))]},
        CHAT | {"tools": [function("a", wide(2500)), function("b", wide(2501))]},
        "tools[1].function.parameters",
    ),
]


@pytest.mark.parametrize(("kind", "allowed", "over", "param"), KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_is_served_at_its_limit_and_refused_past_it(
    server, compiles, kind, allowed, over, param
) -> None:
    """The largest allowed request passes the limits (its grammars compiled, off the event loop)
    and the next one is a 400 naming the field; while either is in flight, ``/health`` answers.

    NOTE: the tool definitions go into the prompt, and 5,000 properties' worth are more tokens
    than the tiny model's context holds: those allowed requests end there (every check and
    grammar compile done), a 400 for the context length."""
    allowed_answer, answered = health_while(
        server.base_url, lambda: post(server, "/v1/chat/completions", allowed)
    )
    assert answered and all(answered), kind
    assert compiles and not any(compiles), (kind, compiles)
    if allowed_answer.status_code != 200:
        assert allowed_answer.json()["error"]["code"] == "context_length_exceeded", allowed_answer.text
        assert "tools" in allowed, allowed_answer.text
    answer, answered = health_while(server.base_url, lambda: post(server, "/v1/chat/completions", over))
    assert answered and all(answered), kind
    refused(answer, param)


def test_a_long_tool_list_with_a_repeated_name_is_refused_at_once(server) -> None:
    """Fifty thousand tools (about 3 MB) are one 400 naming ``tools``, without a quadratic
    duplicate check (the count is checked first), and ``/health`` answers meanwhile."""
    tools = [function(f"t{i}") for i in range(50_000)] + [function("t0")]
    answer, answered = health_while(
        server.base_url, lambda: post(server, "/v1/chat/completions", CHAT | {"tools": tools})
    )
    assert "at most 128 tools" in refused(answer, "tools")
    assert answered and all(answered)


@pytest.mark.parametrize(
    ("dialect", "path", "body"),
    [
        ("openai", "/v1/chat/completions", CHAT | {"tools": [function(f"t{i % 127}") for i in range(128)]}),
        ("anthropic", "/v1/messages", MESSAGES | {"tools": [{"name": f"t{i % 127}"} for i in range(128)]}),
        (
            "openai",
            "/v1/responses",
            RESPONSES | {"tools": [{"type": "function", "name": f"t{i % 127}"} for i in range(128)]},
        ),
    ],
)
def test_a_repeated_tool_name_is_refused(server, dialect, path, body) -> None:
    """Of 128 tools, the last repeating the first's name: a 400 naming ``tools``."""
    assert "`t0` is defined twice" in refused(post(server, path, body), "tools", dialect)


@pytest.mark.parametrize(
    ("dialect", "path", "body"),
    [
        ("openai", "/v1/chat/completions", CHAT),
        ("anthropic", "/v1/messages", MESSAGES),
        ("openai", "/v1/responses", RESPONSES),
    ],
)
def test_too_many_tools_in_every_dialect(server, dialect, path, body) -> None:
    """129 tools are a 400 naming ``tools`` in the dialect's shape."""
    tools = {
        "/v1/chat/completions": [function(f"t{i}") for i in range(129)],
        "/v1/messages": [{"name": f"t{i}"} for i in range(129)],
        "/v1/responses": [{"type": "function", "name": f"t{i}"} for i in range(129)],
    }[path]
    assert "at most 128 tools" in refused(post(server, path, body | {"tools": tools}), "tools", dialect)


ANTHROPIC_TOOL = {"name": "f", "input_schema": "SCHEMA"}
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": "SCHEMA"}
RESPONSES_FORMAT = {"format": {"type": "json_schema", "name": "a", "strict": True, "schema": "SCHEMA"}}
# (dialect, path, body with ``SCHEMA`` where the schema goes, the field named)
PLACES = [
    ("anthropic", "/v1/messages", MESSAGES | {"tools": [ANTHROPIC_TOOL]}, "tools[0].input_schema"),
    ("openai", "/v1/responses", RESPONSES | {"tools": [RESPONSES_TOOL]}, "tools[0].parameters"),
    ("openai", "/v1/responses", RESPONSES | {"text": RESPONSES_FORMAT}, "text.format.schema"),
]


@pytest.mark.parametrize("schema", [nested(40), wide(MAX_PROPERTIES + 1)], ids=["deep", "wide"])
@pytest.mark.parametrize(("dialect", "path", "body", "param"), PLACES)
def test_anthropic_and_responses_have_the_same_limits(server, schema, dialect, path, body, param) -> None:
    """A schema over the depth or the width limit is a 400 naming the field in the Messages and
    Responses APIs too (before: one nested 40 deep took hours to close, a worker thread held)."""
    text = json.dumps(body).replace('"SCHEMA"', json.dumps(schema))
    answer, answered = health_while(server.base_url, lambda: post(server, path, text))
    refused(answer, param, dialect)
    assert answered and all(answered)


# (dialect, path, body with ``SCHEMA`` where the deep schema goes, the field named)
DEEP_PLACES = [
    (
        "openai",
        "/v1/chat/completions",
        CHAT | {"response_format": strict("SCHEMA")},
        "response_format.json_schema.schema",
    ),
    (
        "openai",
        "/v1/chat/completions",
        CHAT | {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "SCHEMA"}}},
        "response_format.json_schema.schema",
    ),
    (
        "openai",
        "/v1/chat/completions",
        CHAT | {"tools": [function("f", {"type": "object", "properties": {"a": "SCHEMA"}})]},
        "tools[0].function.parameters",
    ),
    (
        "anthropic",
        "/v1/messages",
        MESSAGES
        | {"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": "SCHEMA"}}}]},
        "tools[0].input_schema",
    ),
    (
        "anthropic",
        "/v1/messages/count_tokens",
        MESSAGES
        | {"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": "SCHEMA"}}}]},
        "tools[0].input_schema",
    ),
    (
        "openai",
        "/v1/responses",
        RESPONSES | {"text": {"format": {"type": "json_schema", "name": "a", "schema": "SCHEMA"}}},
        "text.format.schema",
    ),
    (
        "openai",
        "/v1/responses",
        RESPONSES
        | {
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"a": "SCHEMA"}},
                }
            ]
        },
        "tools[0].parameters",
    ),
]


@pytest.mark.parametrize("levels", [130, 600])
@pytest.mark.parametrize(("dialect", "path", "body", "param"), DEEP_PLACES)
def test_a_schema_deeper_than_llguidance_parses_is_a_400(server, levels, dialect, path, body, param) -> None:
    """A schema nested past llguidance's parser (128) or far past it is a 400 naming the field,
    in the dialect's error shape (before: a 500)."""
    text = json.dumps(body).replace('"SCHEMA"', arrays(levels))
    assert "64 levels" in refused(post(server, path, text), param, dialect)


def test_gemini_tools_are_refused_without_a_walk(server) -> None:
    """Gemini's ``functionDeclarations`` (not supported here) are refused by name, however deep."""
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": "SCHEMA"}]}],
    }
    answer = post(
        server, "/v1beta/models/tiny:generateContent", json.dumps(body).replace('"SCHEMA"', arrays(600))
    )
    assert answer.status_code == 400 and answer.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "tools" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1beta/models/tiny:generateContent"]
)
def test_a_body_nested_thousands_deep_is_a_400(server, path) -> None:
    """JSON nested 100,000 levels deep (past Python's parser) is a 400, not a 500."""
    text = '{"model": "tiny", "messages": [], "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert post(server, path, text).status_code == 400


@contextmanager
def router_before(key_prefix: str) -> Iterator[ServerThread]:
    """``kvproxy route`` (no tokenizer: it hashes text) in front of one fake replica."""
    with ExitStack() as stack:
        upstream = stack.enter_context(ServerThread(fake_upstream("a")))
        settings = RouteSettings(
            upstream=f"{upstream.base_url}/v1", redis_url=shared_redis_url(), key_prefix=key_prefix
        )
        yield stack.enter_context(ServerThread(create_route_app(settings)))


def test_the_router_is_not_tied_up_by_hostile_tools(key_prefix) -> None:
    """The router's key of a body with a schema nested 600 deep, or 50,000 tools, is computed at
    once (the body then goes to a replica, which refuses it) and a body nested past Python's
    parser is the router's 400: never a 500, and ``/health`` answers meanwhile."""
    deep = json.dumps(CHAT | {"tools": [function("f", {"type": "object", "properties": {"a": "SCHEMA"}})]})
    many = CHAT | {"tools": [function(f"t{i}") for i in range(50_000)]}
    nested_body = '{"model": "fake", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with router_before(key_prefix) as router:
        for body in (deep.replace('"SCHEMA"', arrays(600)), many, nested_body):
            answer, answered = health_while(
                router.base_url, lambda b=body: post(router, "/v1/chat/completions", b)
            )
            assert answer.status_code in (200, 400), answer.text[:300]
            assert answered and all(answered)
        assert answer.status_code == 400


@pytest.mark.parametrize(
    "arguments",
    ["[" * 100 + "]" * 100, "[" * 5000 + "]" * 5000, '{"a": ' + "[" * 2000],
    ids=["past the depth limit", "past Python's parser", "cut short past Python's parser"],
)
def test_deep_call_arguments_in_a_history_are_its_text(server, arguments) -> None:
    """A past call's arguments nested past the depth limit, or past Python's parser, whole or
    cut short (a model writes a thousand brackets; the client sends them back), are rendered
    as their text in the chat and the Responses API: answered or refused for the context's
    length, never a 500 (before: a 500, then a 400 that killed the conversation)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    chat = CHAT | {
        "messages": [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
    }
    responses = RESPONSES | {
        "input": [
            *USER,
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ]
    }
    for path, body in (("/v1/chat/completions", chat), ("/v1/responses", responses)):
        answer = post(server, path, body)
        assert answer.status_code == 200 or answer.json()["error"]["code"] == "context_length_exceeded", (
            path,
            answer.text[:300],
        )
