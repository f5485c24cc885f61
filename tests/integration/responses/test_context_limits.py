"""A Responses request over the context, in the hosted API's two shapes (tiny model served with a
256-token context, real HTTP): without ``stream`` a 400 ``context_length_exceeded`` naming
``input`` (or ``max_output_tokens``), as the official ``openai`` client reads it; with ``stream``
the refusal in the stream, ending in ``response.failed`` whose error code is the one Codex
compacts on (it reads no other signal: a 400 would fail its turn). Nothing is computed, stored
or kept as a response."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.replicas import text

CONTEXT = 256
CODEX_CONTEXT_CODE = "context_length_exceeded"  # NOTE: test data: Codex's is_context_window_error
HOSTED_INPUT_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
LONG = text(10, 300)  # about 480 tokens


@pytest.fixture
def server(settings, tiny_model, serve) -> Iterator:
    with serve(settings, dataclasses.replace(tiny_model, context_length=CONTEXT)) as running:
        yield running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def tokens(server, content: str) -> int:
    body = {"messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{server.base_url}/tokenize", json=body).json()["count"]


def sse_events(response: httpx.Response) -> list[dict]:
    """The ``data`` of each server-sent event, as Codex's reader takes them."""
    return [
        json.loads(line[len("data: ") :]) for line in response.text.splitlines() if line.startswith("data: ")
    ]


def test_an_input_over_the_context_is_a_400_naming_input(server) -> None:
    """Without ``stream``: 400 ``invalid_request_error``, ``context_length_exceeded``, ``input``;
    the message starts with the hosted one and gives the input's length and the window."""
    n = tokens(server, LONG)
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).responses.create(model="tiny", input=LONG)
    error = refused.value
    assert (error.status_code, error.type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "input",
    )
    assert error.body["message"].startswith(HOSTED_INPUT_MESSAGE)
    assert f"input: {n} tokens; context window: {CONTEXT} tokens" in error.body["message"]


def test_max_output_tokens_the_context_cannot_hold_names_it(server) -> None:
    """A short input with ``max_output_tokens`` 1,000: ``context_length_exceeded`` naming
    ``max_output_tokens``, its message adding up the input, the output asked and the window."""
    n = tokens(server, "Hello")
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).responses.create(model="tiny", input="Hello", max_output_tokens=1000)
    error = refused.value
    assert (error.code, error.param) == ("context_length_exceeded", "max_output_tokens")
    assert f"{n} input tokens + 1000 > {CONTEXT}" in error.body["message"]


def test_a_streamed_refusal_comes_in_the_stream_as_codex_reads_it(server, settings) -> None:
    """With ``stream``: 200, then response.created, response.in_progress, an ``error`` event and
    response.failed whose ``response.error.code`` is ``context_length_exceeded`` (what Codex
    compacts on) with the 400's message; the official client raises that error's code and
    ``param`` from the stream; the response is not kept and nothing is stored."""
    body = {"model": "tiny", "input": LONG, "stream": True}
    streamed = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=60)
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed)
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "error", "response.failed"]
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == CODEX_CONTEXT_CODE
    assert failed["error"]["message"].startswith(HOSTED_INPUT_MESSAGE)
    error = events[2]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
    assert error["error"]["type"] == "invalid_request_error"

    with pytest.raises(openai.APIError) as raised:
        for _ in client(server).responses.create(model="tiny", input=LONG, stream=True):
            pass
    assert (raised.value.code, raised.value.param) == ("context_length_exceeded", "input")

    missing = httpx.get(f"{server.base_url}/v1/responses/{failed['id']}")
    assert missing.status_code == 404
    assert not list(settings.blob_root.rglob("*.safetensors"))
