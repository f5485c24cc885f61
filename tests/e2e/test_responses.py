"""The Responses API on the default model with the official ``openai`` client: a conversation
chained by ``previous_response_id`` answers what ``/v1/chat/completions`` answers for the same
conversation, turns 2-4 reuse every earlier turn, and the conversation goes on after a restart
and on a second replica sharing the Redis."""

from __future__ import annotations

import argparse
import inspect
import itertools

from openai import OpenAI

from tests.api import Api

MODEL = "smollm2-135m-instruct"
INSTRUCTIONS = "You answer questions about this manual.\n\n" + inspect.getdoc(argparse)[:3000]
QUESTIONS = ("What does this module do?", "Give one example of its use.", "Name one alternative.", "Thanks!")
GREEDY = {"model": MODEL, "temperature": 0, "max_output_tokens": 60, "instructions": INSTRUCTIONS}


def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def respond(server, question: str, previous: str | None, stream: bool):
    """One turn; the final response object (from ``response.completed`` when streamed)."""
    kwargs = GREEDY | {"input": question, "previous_response_id": previous}
    if stream:
        return list(client(server).responses.create(stream=True, **kwargs))[-1].response
    return client(server).responses.create(**kwargs)


def chat_answer(server, responses: list, question: str) -> str:
    """The chat route's answer to the conversation of ``responses`` followed by ``question``."""
    messages = [{"role": "system", "content": INSTRUCTIONS}]
    for asked, response in zip(QUESTIONS, responses, strict=False):
        messages += [
            {"role": "user", "content": asked},
            {"role": "assistant", "content": response.output_text},
        ]
    messages.append({"role": "user", "content": question})
    reply = client(server).chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_completion_tokens=60
    )
    return reply.choices[0].message.content


def test_conversation_equals_chat_hits_and_survives(settings, default_model, serve) -> None:
    with serve(settings, default_model) as server:
        responses = []
        for i, question in enumerate(QUESTIONS[:3]):
            previous = responses[-1].id if responses else None
            responses.append(respond(server, question, previous, stream=i != 1))
            Api(server).flush()
        answers = [chat_answer(server, responses[:i], q) for i, q in enumerate(QUESTIONS[:3])]
        print(
            "turn, input tokens, cached tokens:",
            [
                (i + 1, r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens)
                for i, r in enumerate(responses)
            ],
        )
        assert [r.output_text for r in responses] == answers
        for before, after in itertools.pairwise(responses):
            assert (
                after.usage.input_tokens_details.cached_tokens
                >= before.usage.input_tokens + before.usage.output_tokens
            )
    with serve(settings, default_model) as restarted, serve(settings, default_model) as second:
        fourth = respond(restarted, QUESTIONS[3], responses[-1].id, stream=True)
        again = respond(second, QUESTIONS[3], responses[-1].id, stream=False)
        expected = chat_answer(restarted, responses, QUESTIONS[3])
        earlier = responses[-1].usage.input_tokens + responses[-1].usage.output_tokens
        print(
            "turn 4 after a restart, and on a second replica:",
            fourth.usage.input_tokens_details.cached_tokens,
            again.usage.input_tokens_details.cached_tokens,
            "of",
            fourth.usage.input_tokens,
        )
        assert fourth.output_text == again.output_text == expected
        assert fourth.usage.input_tokens_details.cached_tokens >= earlier
        assert again.usage.input_tokens_details.cached_tokens >= earlier
