"""OpenAI compatibility with the official client: sync, async, streaming, token-id prompts, and
the request fields chat apps send."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI, BadRequestError, OpenAI

from tests.helpers import random_tokens

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(cached):
    return OpenAI(base_url=f"{cached.server.base_url}/v1", api_key="unused")


def test_sync_async_and_streaming_agree(cached, client) -> None:
    """One greedy request three ways: the same text and usage with cached_tokens."""
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)

    async def run_async():
        aclient = AsyncOpenAI(base_url=f"{cached.server.base_url}/v1", api_key="unused")
        return await aclient.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=10, temperature=0
        )

    async_reply = asyncio.run(run_async())
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert plain.choices[0].message.content == async_reply.choices[0].message.content == streamed
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    assert plain.usage.prompt_tokens_details.cached_tokens == 0


def test_completions_with_token_ids_and_text_parts(cached, client) -> None:
    """Token-id prompts; content given as text parts equals the plain string."""
    prompt = random_tokens(200, seed=3)
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    cached.flush()
    second = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens == 199  # a block and a tail: all but the last
    assert first.choices[0].text == second.choices[0].text
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is the capital "},
                {"type": "text", "text": "of France?"},
            ],
        }
    ]
    a = client.chat.completions.create(model="tiny", messages=parts, max_tokens=8, temperature=0)
    b = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_sampling_fields(client) -> None:
    """seed reproduces; max_completion_tokens bounds; logprobs have OpenAI's shape; penalties apply."""
    kwargs = {"model": "tiny", "messages": MESSAGES, "temperature": 1.0, "max_completion_tokens": 12}
    one = client.chat.completions.create(seed=7, **kwargs)
    two = client.chat.completions.create(seed=7, **kwargs)
    assert one.choices[0].message.content == two.choices[0].message.content
    assert one.usage.completion_tokens <= 12

    greedy = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 30}
    base = client.chat.completions.create(**greedy, extra_body={"return_token_ids": True})
    penalized = client.chat.completions.create(
        frequency_penalty=2.0, **greedy, extra_body={"return_token_ids": True}
    )
    ids, penalized_ids = (
        base.choices[0].model_extra["token_ids"],
        penalized.choices[0].model_extra["token_ids"],
    )
    assert len(set(penalized_ids)) > len(set(ids))  # the tiny model repeats itself; the penalty stops it

    lp = client.chat.completions.create(logprobs=True, top_logprobs=3, **greedy)
    content = lp.choices[0].logprobs.content
    assert len(content) == len(base.choices[0].model_extra["token_ids"])
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)  # greedy = the best


def test_logit_bias_applies(client) -> None:
    """+100 on one token makes greedy decoding choose it every time."""
    reply = client.completions.create(
        model="tiny",
        prompt="hello",
        max_tokens=4,
        temperature=0,
        logit_bias={"42": 100},
        extra_body={"return_token_ids": True},
    )
    assert reply.choices[0].model_extra["token_ids"] == [42, 42, 42, 42]


def test_stop_strings_are_excluded(client) -> None:
    """The text ends before the first stop string; finish_reason is stop."""
    full = client.completions.create(model="tiny", prompt="The quick brown", max_tokens=20, temperature=0)
    text = full.choices[0].text
    stop = text[5:8]
    assert len(stop) == 3 and text.find(stop) >= 0
    cut = client.completions.create(
        model="tiny", prompt="The quick brown", max_tokens=20, temperature=0, stop=[stop, "zzz"]
    )
    assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    longer = text[5:12]  # one string of any length (OpenAI's limit is on the list: 4 strings)
    alone = client.completions.create(
        model="tiny", prompt="The quick brown", max_tokens=20, temperature=0, stop=longer
    )
    assert alone.choices[0].text == text[: text.find(longer)] and alone.choices[0].finish_reason == "stop"
    with pytest.raises(BadRequestError):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, stop=["a", "b", "c", "d", "e"])


def test_echo_and_developer_role(client) -> None:
    echoed = client.completions.create(
        model="tiny", prompt="hello there", max_tokens=3, temperature=0, echo=True
    )
    plain = client.completions.create(model="tiny", prompt="hello there", max_tokens=3, temperature=0)
    assert echoed.choices[0].text == "hello there" + plain.choices[0].text
    dev = [{"role": "developer", "content": "Be brief."}, *MESSAGES]
    sys_ = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    a = client.chat.completions.create(model="tiny", messages=dev, max_tokens=5, temperature=0)
    b = client.chat.completions.create(model="tiny", messages=sys_, max_tokens=5, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
