"""A Messages request over the context, answered in the hosted API's words so that Claude Code
recovers from it (official ``anthropic`` SDK, tiny model of 4,096 tokens, real HTTP): a
``max_tokens`` the context cannot hold is "input length and `max_tokens` exceed context limit",
whose three numbers Claude Code reads to retry with a smaller ``max_tokens``; a prompt that does
not fit at all is "prompt is too long", on which it compacts. Nothing is computed or stored for
either."""

from __future__ import annotations

import json
import re

import anthropic
import pytest

from tests.replicas import text

# NOTE: test data: the patterns Claude Code 2.1 applies to these errors, as its npm package has
# them. It matches them against the SDK's ``APIError.message``, which the TypeScript SDK builds as
# ``f"{status} {JSON of the body}"`` (``claude_code_message``); the first only when the status is 400.
CLAUDE_CODE_MAX_TOKENS = re.compile(
    r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)"
)
CLAUDE_CODE_PROMPT_TOO_LONG = re.compile(
    r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.IGNORECASE
)
CLAUDE_CODE_RESERVE, CLAUDE_CODE_FLOOR = 1000, 3000
"""Claude Code's retry: ``max_tokens = max(FLOOR, context - input - RESERVE)``, and no retry when
the context leaves less than the floor."""

CONTEXT = 4096  # the tiny model's
QUESTION = "What does a prefix cache keep? " + text(7, 20)  # about 40 tokens
LONG = text(8, 3000)  # about 4,800 tokens: more than the context


def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def refusal(server, **fields) -> anthropic.BadRequestError:
    """The error the SDK raises for a request the server refuses."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(server).messages.create(model="tiny", **fields)
    return refused.value


def claude_code_message(error: anthropic.APIStatusError) -> str:
    """The error's message as Claude Code sees it (the TypeScript SDK's)."""
    return f"{error.status_code} {json.dumps(error.body, separators=(',', ':'), ensure_ascii=False)}"


def counted(server, content: str) -> int:
    return (
        client(server)
        .messages.count_tokens(model="tiny", messages=[{"role": "user", "content": content}])
        .input_tokens
    )


def test_a_max_tokens_the_context_cannot_hold_is_retried_as_claude_code_does(cached) -> None:
    """A 40-token prompt with ``max_tokens`` 5,000: 400 ``invalid_request_error`` whose message is
    the hosted one, unprefixed; Claude Code's pattern reads the prompt's length (as count_tokens
    gives it), the ``max_tokens`` asked and the context; the ``max_tokens`` it retries with is
    accepted."""
    server = cached.server
    n = counted(server, QUESTION)
    error = refusal(server, max_tokens=5000, messages=[{"role": "user", "content": QUESTION}])

    assert error.status_code == 400
    assert error.body["type"] == "error" and error.body["error"]["type"] == "invalid_request_error"
    assert error.body["error"]["message"] == (
        f"input length and `max_tokens` exceed context limit: {n} + 5000 > {CONTEXT}, "
        "decrease input length or `max_tokens` and try again"
    )
    found = CLAUDE_CODE_MAX_TOKENS.search(claude_code_message(error))
    assert found is not None
    input_tokens, max_tokens, context = (int(g) for g in found.groups())
    assert (input_tokens, max_tokens, context) == (n, 5000, CONTEXT)

    available = context - input_tokens - CLAUDE_CODE_RESERVE
    assert available >= CLAUDE_CODE_FLOOR  # NOTE: else Claude Code gives up rather than retry
    retry = max(CLAUDE_CODE_FLOOR, available)
    # NOTE: the retry is accepted: its stream starts (closing it then cancels the generation)
    with client(server).messages.stream(
        model="tiny", max_tokens=retry, messages=[{"role": "user", "content": QUESTION}]
    ) as stream:
        first = next(iter(stream))
    assert first.type == "message_start"
    usage = first.message.usage
    assert (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        == n
    )


@pytest.mark.parametrize("max_tokens", [1, 5000])
def test_a_prompt_over_the_context_is_too_long_in_claude_codes_words(cached, settings, max_tokens) -> None:
    """A prompt of more tokens than the context: "prompt is too long: N tokens > M maximum" (the
    hosted text, whatever ``max_tokens`` asks), N the prompt's length as count_tokens gives it and
    M the longest prompt that leaves a token to generate; Claude Code's pattern finds a positive
    overflow to compact away; the stream is refused the same way before it starts; nothing is
    stored."""
    server = cached.server
    n = counted(server, LONG)  # NOTE: count_tokens refuses no length: hosted, it counts any prompt
    assert n > CONTEXT
    messages = [{"role": "user", "content": LONG}]
    error = refusal(server, max_tokens=max_tokens, messages=messages)

    assert error.status_code == 400 and error.body["error"]["type"] == "invalid_request_error"
    assert error.body["error"]["message"] == f"prompt is too long: {n} tokens > {CONTEXT - 1} maximum"
    found = CLAUDE_CODE_PROMPT_TOO_LONG.search(claude_code_message(error))
    assert found is not None
    actual, limit = (int(g) for g in found.groups())
    assert (actual, limit) == (n, CONTEXT - 1) and actual - limit > 0

    with pytest.raises(anthropic.BadRequestError) as streamed:
        with client(server).messages.stream(model="tiny", max_tokens=max_tokens, messages=messages) as stream:
            next(iter(stream))
    assert streamed.value.body["error"]["message"] == error.body["error"]["message"]
    assert not list(settings.blob_root.rglob("*.safetensors"))
