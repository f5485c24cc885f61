"""Chat completions and legacy completions over the context, in the hosted API's words (official
``openai`` client, tiny model served with a 256-token context, real HTTP): 400
``invalid_request_error``, ``code: context_length_exceeded``, ``param`` the field to change, and
the sentences clients match ("This model's maximum context length is": LiteLLM's
``ContextWindowExceededError``, which aider acts on), their numbers those of the request. Nothing
is computed or stored for them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.replicas import text

CONTEXT = 256
LITELLM_MARKER = "This model's maximum context length is"  # NOTE: test data: what LiteLLM looks for
CHAT_MESSAGES = re.compile(
    r"^This model's maximum context length is (\d+) tokens\. However, your messages resulted in (\d+) "
    r"tokens\. Please reduce the length of the messages\.$"
)
CHAT_REQUESTED = re.compile(
    r"^This model's maximum context length is (\d+) tokens\. However, you requested (\d+) tokens "
    r"\((\d+) in the messages, (\d+) in the completion\)\. Please reduce the length of the messages or "
    r"completion\.$"
)
COMPLETION_REQUESTED = re.compile(
    r"^This model's maximum context length is (\d+) tokens, however you requested (\d+) tokens "
    r"\((\d+) in your prompt; (\d+) for the completion\)\. Please reduce your prompt; or completion "
    r"length\.$"
)
SHORT = [{"role": "user", "content": "What is a prefix cache?"}]
LONG = [{"role": "user", "content": text(9, 300)}]  # about 480 tokens


@pytest.fixture
def server(settings, tiny_model, serve) -> Iterator:
    with serve(settings, dataclasses.replace(tiny_model, context_length=CONTEXT)) as running:
        yield running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def refusal(create, **fields) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as refused:
        create(model="tiny", **fields)
    error = refused.value
    assert error.status_code == 400 and error.type == "invalid_request_error"
    assert error.code == "context_length_exceeded" and LITELLM_MARKER in error.message
    return error


def tokens(server, messages: list[dict]) -> int:
    return httpx.post(f"{server.base_url}/tokenize", json={"messages": messages}).json()["count"]


def numbers(pattern: re.Pattern[str], error: openai.BadRequestError) -> tuple[int, ...]:
    found = pattern.match(error.body["message"])
    assert found is not None, error.body["message"]
    return tuple(int(g) for g in found.groups())


@pytest.mark.parametrize("stream", [False, True])
def test_chat_messages_over_the_context_name_the_messages(server, settings, stream) -> None:
    """Messages longer than the context, no ``max_tokens``: "your messages resulted in N tokens"
    (N as /tokenize counts them) naming ``messages``; a stream is refused before it starts."""
    n = tokens(server, LONG)
    error = refusal(client(server).chat.completions.create, messages=LONG, stream=stream)
    assert error.param == "messages"
    assert numbers(CHAT_MESSAGES, error) == (CONTEXT, n)
    assert not list(settings.blob_root.rglob("*.safetensors"))


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_completion_the_context_cannot_hold_names_the_field_the_body_set(server, field) -> None:
    """Short messages with 1,000 tokens asked: "you requested N+1000 tokens (N in the messages,
    1000 in the completion)", naming the field the body used; with long messages as well, the
    same sentence names ``messages``."""
    n = tokens(server, SHORT)
    error = refusal(client(server).chat.completions.create, messages=SHORT, **{field: 1000})
    assert error.param == field
    assert numbers(CHAT_REQUESTED, error) == (CONTEXT, n + 1000, n, 1000)

    n = tokens(server, LONG)
    error = refusal(client(server).chat.completions.create, messages=LONG, **{field: 1000})
    assert error.param == "messages"
    assert numbers(CHAT_REQUESTED, error) == (CONTEXT, n + 1000, n, 1000)


def test_legacy_completions_count_the_prompt_and_the_completion(server) -> None:
    """A token-id prompt that fits with 1,000 tokens asked names ``max_tokens`` ("N in your prompt;
    1000 for the completion"); one that leaves no room names ``prompt``, its completion counted
    as asked or as the default 16."""
    create = client(server).completions.create
    error = refusal(create, prompt=[1] * 100, max_tokens=1000)
    assert error.param == "max_tokens"
    assert numbers(COMPLETION_REQUESTED, error) == (CONTEXT, 1100, 100, 1000)

    error = refusal(create, prompt=[1] * 300, max_tokens=16)
    assert error.param == "prompt"
    assert numbers(COMPLETION_REQUESTED, error) == (CONTEXT, 316, 300, 16)

    error = refusal(create, prompt=[1] * CONTEXT)  # NOTE: max_tokens defaults to 16, as OpenAI's
    assert error.param == "prompt"
    assert numbers(COMPLETION_REQUESTED, error) == (CONTEXT, CONTEXT + 16, CONTEXT, 16)
