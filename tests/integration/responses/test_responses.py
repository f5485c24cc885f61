"""The Responses API on the tiny model, through the official ``openai`` client: the response
and its streamed events, ``previous_response_id`` conversations that equal the chat route's and
hit the cache, state that survives a restart and is shared by a second replica, tenants, expiry,
the byte budget, tools, ``text.format``, and refusals that name the field."""

from __future__ import annotations

import itertools
import json
import time

import httpx
import openai
import pytest
from openai import OpenAI

from tests.api import Api

QUESTIONS = (
    "the quick brown fox jumps over the lazy dog " * 12,
    "and then what did the fox do next",
    "where did the dog go after that",
    "tell me the end of the story",
)
GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 12}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    # NOTE: the tiny model is random: a bounded string lets the grammar end every call
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def client(server, key: str = "x") -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def converse(server, stream_first: bool = True, turns: int = 4, previous: str | None = None) -> list:
    """A conversation of ``turns`` turns chained by ``previous_response_id`` (the first streamed
    when ``stream_first``); the final response object of each turn."""
    out = []
    for i, question in enumerate(QUESTIONS[:turns]):
        kwargs = GREEDY | {"input": question, "instructions": "Be brief.", "previous_response_id": previous}
        if i == 0 and stream_first:
            events = list(client(server).responses.create(stream=True, **kwargs))
            response = events[-1].response
        else:
            response = client(server).responses.create(**kwargs)
        Api(server).flush()
        out.append(response)
        previous = response.id
    return out


def test_conversation_hits_and_equals_uncached(settings, tiny_model, serve) -> None:
    """Turns 2-4 through ``previous_response_id`` report cached tokens covering every earlier
    turn, prompt and answer (the tiny model's answers never re-tokenize as generated: the
    continuation starts with the generated tokens, ``proxy.responses.continuation``), and answer
    what a ``--no-cache`` server answers; after a restart, and on a second replica sharing the
    Redis, the conversation goes on."""
    with serve(settings, tiny_model) as server:
        responses = converse(server, turns=3)
        for before, after in itertools.pairwise(responses):
            earlier = before.usage.input_tokens + before.usage.output_tokens
            assert after.usage.input_tokens_details.cached_tokens >= earlier, (before.usage, after.usage)
    cold_settings = settings.model_copy(
        update={"no_cache": True, "key_prefix": settings.key_prefix + "cold:"}
    )
    with serve(cold_settings, tiny_model) as cold:
        assert [r.output_text for r in converse(cold, turns=3)] == [r.output_text for r in responses]
    with serve(settings, tiny_model) as restarted, serve(settings, tiny_model) as second:
        fourth = client(restarted).responses.create(
            **GREEDY, input=QUESTIONS[3], instructions="Be brief.", previous_response_id=responses[-1].id
        )
        earlier = responses[-1].usage.input_tokens + responses[-1].usage.output_tokens
        assert fourth.usage.input_tokens_details.cached_tokens >= earlier
        again = client(second).responses.retrieve(fourth.id)
        assert again.output_text == fourth.output_text and again.previous_response_id == responses[-1].id
        from_second = client(second).responses.create(
            **GREEDY, input=QUESTIONS[3], instructions="Be brief.", previous_response_id=responses[-1].id
        )
        assert from_second.output_text == fourth.output_text
        assert from_second.usage.input_tokens_details.cached_tokens >= earlier


def test_changed_instructions_render_the_conversation_again(cached) -> None:
    """A continuation whose instructions differ from the stored turn's is the chat route's
    rendering of the new conversation: the stored ids stand only for the same history."""
    first = client(cached.server).responses.create(**GREEDY, input=QUESTIONS[1], instructions="Be brief.")
    Api(cached.server).flush()
    second = client(cached.server).responses.create(
        **GREEDY, input=QUESTIONS[2], instructions="Be long.", previous_response_id=first.id
    )
    messages = [
        {"role": "system", "content": "Be long."},
        {"role": "user", "content": QUESTIONS[1]},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": QUESTIONS[2]},
    ]
    chat = client(cached.server).chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_completion_tokens=12
    )
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_streamed_events_in_documented_order(settings, tiny_model, serve) -> None:
    """created, in_progress, item added, part added, deltas, text done, part done, item done,
    then completed or incomplete; the final response's text is the deltas' text, and it is the
    non-streamed answer."""
    with serve(settings, tiny_model) as server:
        events = list(client(server).responses.create(**GREEDY, input=QUESTIONS[1], stream=True))
        plain = client(server).responses.create(**GREEDY, input=QUESTIONS[1])
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    middle = ["response.output_text.delta"] * len(deltas)
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *middle,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if plain.status == "incomplete" else "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "".join(d.delta for d in deltas) == plain.output_text
    assert final.output[0].id == events[2].item.id == deltas[0].item_id
    assert events[2].item.status == "in_progress" and final.output[0].status in ("completed", "incomplete")
    assert final.usage.input_tokens == plain.usage.input_tokens


def test_stored_response_get_input_items_delete(cached) -> None:
    """GET returns the response; ``input_items`` pages this request's items, newest first by
    default; DELETE removes it, and then it is an unknown id; ``store: false`` keeps nothing."""
    server = cached.server
    api = client(server)
    items = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]},
    ]
    made = api.responses.create(**GREEDY, input=items, metadata={"run": "7"})
    assert api.responses.retrieve(made.id).output_text == made.output_text
    assert api.responses.retrieve(made.id).metadata == {"run": "7"}
    listed = api.responses.input_items.list(made.id)
    assert [i.content[0].text for i in listed.data] == ["second", "ok", "first"]
    page = api.responses.input_items.list(made.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["first", "ok"] and page.has_more
    rest = api.responses.input_items.list(made.id, order="asc", after=page.last_id)
    assert [i.content[0].text for i in rest.data] == ["second"] and not rest.has_more
    assert api.responses.delete(made.id) is None
    with pytest.raises(openai.NotFoundError, match="No response found"):
        api.responses.retrieve(made.id)
    unstored = api.responses.create(**GREEDY, input="hello", store=False)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as err:
        api.responses.create(**GREEDY, input="x", previous_response_id=unstored.id)
    assert err.value.body["param"] == "previous_response_id"


def test_tenants_and_expiry(settings, tiny_model, serve) -> None:
    """Another tenant's response id is a 404 like an unknown one; an expired id is a 404 that
    says it expired or was evicted.

    NOTE: the tenants on a server keeping responses as long as by default, the expiry on one
    keeping them 1 s: a response that must still be there is never one that a slow request could
    outlive."""
    keyed = settings.model_copy(update={"api_keys": "key-a,key-b"})
    with serve(keyed, tiny_model) as server:
        mine = client(server, "key-a").responses.create(**GREEDY, input="hello")
        for call in (
            lambda: client(server, "key-b").responses.retrieve(mine.id),
            lambda: client(server, "key-b").responses.create(
                **GREEDY, input="x", previous_response_id=mine.id
            ),
            lambda: client(server, "key-b").responses.delete(mine.id),
        ):
            with pytest.raises(openai.NotFoundError, match="No response found"):
                call()
        assert client(server, "key-a").responses.retrieve(mine.id).id == mine.id
    with serve(keyed.model_copy(update={"responses_ttl": 1}), tiny_model) as server:
        gone = client(server, "key-a").responses.create(**GREEDY, input="hello")
        time.sleep(2.1)  # NOTE: at least the TTL; a slower machine only waits longer
        with pytest.raises(openai.NotFoundError, match="expired or was evicted"):
            client(server, "key-a").responses.create(**GREEDY, input="x", previous_response_id=gone.id)


def test_byte_budget_evicts_oldest(settings, tiny_model, serve) -> None:
    """Past ``--responses-max-bytes`` the oldest stored responses go first, and say so."""
    with serve(settings.model_copy(update={"responses_max_bytes": 6000}), tiny_model) as server:
        ids = [client(server).responses.create(**GREEDY, input=f"question {i} " * 20).id for i in range(6)]
        with pytest.raises(openai.NotFoundError, match="expired or was evicted"):
            client(server).responses.retrieve(ids[0])
        assert client(server).responses.retrieve(ids[-1]).id == ids[-1]


def test_function_tools_round_trip(cached) -> None:
    """A required tool call comes back as a ``function_call`` item; its output, sent with
    ``previous_response_id``, continues the conversation (streamed: the argument deltas add up to
    the call's arguments)."""
    api = client(cached.server)
    first = api.responses.create(
        **GREEDY | {"max_output_tokens": 200},
        input="weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
    )
    call = first.output[-1]
    assert (
        call.type == "function_call" and call.name == "get_weather" and "city" in json.loads(call.arguments)
    )
    Api(cached.server).flush()
    second = api.responses.create(
        **GREEDY,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        tool_choice="none",
    )
    assert second.output[0].type == "message"
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    events = list(
        api.responses.create(
            **GREEDY | {"max_output_tokens": 200},
            input="weather in Oslo?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            stream=True,
        )
    )
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = events[-1].response.output[-1]
    assert done.type == "function_call" and done.arguments == args and json.loads(args)


def test_text_format_json_schema(cached) -> None:
    """``text.format`` json_schema: the answer is JSON of the schema, streamed or not."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    form = {"format": {"type": "json_schema", "name": "count", "schema": schema, "strict": True}}
    api = client(cached.server)
    response = api.responses.create(**GREEDY | {"max_output_tokens": 200}, input="a number", text=form)
    assert isinstance(json.loads(response.output_text)["n"], int)
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": "hi", "tools": [{"name": "no_type"}]}, "tools[0].type"),
        (
            {"input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": [{"name": "f"}]}]},
            "tools[0].tools[0].type",
        ),
        (
            {"input": "hi", "tools": [{"type": "web_search"}, {**WEATHER, "name": "bad name!"}]},
            "tools[1].name",
        ),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "bad name!", "schema": {}}}},
            "text.format.name",
        ),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
    ],
)
def test_bad_requests_name_the_field(cached, body, param) -> None:
    """A request kvproxy cannot serve is a 400 naming the field as the Responses API names it."""
    r = httpx.post(f"{cached.server.base_url}/v1/responses", json={"model": "tiny"} | body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_unknown_route_names_the_routes(cached) -> None:
    r = httpx.post(f"{cached.server.base_url}/v1/responsez", json={})
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "POST /v1/responsez is not a route" in message and "POST /v1/responses" in message
