"""The agents check's recording proxy (``bench.agents.recorder``) between the official clients
and a real server: each request's usage, read from a JSON body or a stream in every dialect, is
the usage the client itself got; the explanation it asks for never reaches the client; a refused
body is kept with the server's error text."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from bench.agents.recorder import EXPLANATION_FIELD, Recorder

SYSTEM = "You are a careful assistant. " * 40  # NOTE: several 128-token blocks, so a repeat hits
QUESTION = "Name a colour."


@pytest.fixture
def recorder(cached) -> Iterator[Recorder]:
    proxy = Recorder(cached.server.base_url).start()
    yield proxy
    proxy.stop()


def test_messages_usage_json_and_stream(recorder) -> None:
    """Anthropic's usage (read + created + input = prompt), whole and streamed, as the client saw it."""
    client = anthropic.Anthropic(base_url=recorder.base_url, api_key="x")
    kwargs = {
        "model": "tiny",
        "max_tokens": 4,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    recorder.label = "messages"
    first = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as events:
        second = events.get_final_message()
    seen = recorder.of("messages")
    assert [e.status for e in seen] == [200, 200]
    for exchange, reply in zip(seen, (first, second), strict=True):
        usage = reply.usage
        prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        assert (exchange.usage.prompt, exchange.usage.cached) == (prompt, usage.cache_read_input_tokens)
        assert exchange.explanation is not None and exchange.explanation["prompt_tokens"] == prompt
    assert seen[1].usage.cached > 0
    assert EXPLANATION_FIELD not in first.model_dump()


def test_responses_and_chat_usage_streamed(recorder) -> None:
    """The Responses API's and chat completions' streamed usage, as the client saw it."""
    client = openai.OpenAI(base_url=f"{recorder.base_url}/v1", api_key="x")
    recorder.label = "responses"
    for _ in range(2):
        events = list(
            client.responses.create(
                model="tiny", instructions=SYSTEM, input=QUESTION, max_output_tokens=4, stream=True
            )
        )
    final = events[-1].response  # NOTE: response.incomplete here: 4 tokens end it
    last = recorder.of("responses")[-1]
    assert final.usage is not None
    assert (last.usage.prompt, last.usage.cached) == (
        final.usage.input_tokens,
        final.usage.input_tokens_details.cached_tokens,
    )
    assert (
        last.usage.cached > 0 and last.usage.ended is not None and last.usage.ended.startswith(final.status)
    )
    recorder.label = "chat"
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    [chat] = recorder.of("chat")
    assert (chat.usage.prompt, chat.usage.cached) == (
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens,
    )


def test_refused_body_kept_with_the_error(recorder) -> None:
    """A 400 is recorded with the body sent and the server's message."""
    client = anthropic.Anthropic(base_url=recorder.base_url, api_key="x", max_retries=0)
    recorder.label = "refused"
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="tiny", max_tokens=0, messages=[{"role": "user", "content": QUESTION}])
    [exchange] = recorder.of("refused")
    assert exchange.status == 400 and b'"max_tokens":0' in exchange.body.replace(b" ", b"")
    assert exchange.error_text and exchange.error_text in str(refused.value)
