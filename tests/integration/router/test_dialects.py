"""``kvproxy route`` speaks every route its ``kvproxy serve`` replicas speak: the anthropic
client's README example, a Responses conversation chained by ``previous_response_id`` (every
turn on the replica holding its prefix, and hitting), stored responses read and deleted through
it, ``/tokenize``, ``/detokenize`` and ``count_tokens``; each dialect's prompt is hashed as the
replica renders it. Three tiny-model replicas, each with its own cache and state."""

from __future__ import annotations

import argparse
import inspect
import itertools

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from tests.replicas import cluster

DOCUMENT = inspect.getdoc(argparse)[:2500]
QUESTIONS = ("what is the story about", "and then what", "where did it go", "how does it end")


@pytest.fixture
def routed(settings, tiny_model, tmp_path):
    with cluster(settings, tiny_model, tmp_path) as (fronts, replicas):
        yield fronts[0], replicas


def test_anthropic_readme_example_through_the_router(routed) -> None:
    """The README's anthropic example: both questions land on one replica; the second reads
    the document's blocks."""
    front, _ = routed
    client = anthropic.Anthropic(base_url=front.base_url, api_key="unused", max_retries=0)
    seen, usages = set(), []
    for question in ("Summarize it.", "What is a block?"):
        raw = client.messages.with_raw_response.create(
            model="tiny",
            max_tokens=8,
            system=[{"type": "text", "text": DOCUMENT, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            messages=[{"role": "user", "content": question}],
        )
        seen.add(raw.headers["x-kvproxy-replica"])
        usages.append(raw.parse().usage)
    assert len(seen) == 1
    assert usages[1].cache_read_input_tokens > 0
    stream = client.messages.create(
        model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert [e.type for e in stream][-1] == "message_stop"


def test_responses_conversation_sticks_to_its_replica_and_hits(routed) -> None:
    """Four turns chained by ``previous_response_id`` through the router: one replica answers
    all of them (``affinity`` from turn 2), turns 2-4 reuse every earlier turn; the stored
    response is read, listed and deleted through the router, and an unknown one is a 404."""
    front, _ = routed
    client = OpenAI(base_url=f"{front.base_url}/v1", api_key="x", max_retries=0)
    previous, replicas, decisions, responses = None, set(), [], []
    for i, question in enumerate(QUESTIONS):
        kwargs = {"model": "tiny", "input": question, "temperature": 0, "max_output_tokens": 8}
        raw = client.responses.with_raw_response.create(
            previous_response_id=previous, stream=i == 1, **kwargs
        )
        response = raw.parse()
        if i == 1:
            response = list(response)[-1].response
        replicas.add(raw.headers["x-kvproxy-replica"])
        decisions.append(raw.headers["x-kvproxy-route"])
        responses.append(response)
        previous = response.id
    assert len(replicas) == 1 and decisions[1:] == ["affinity"] * 3, decisions
    for before, after in itertools.pairwise(responses):
        earlier = before.usage.input_tokens + before.usage.output_tokens
        assert after.usage.input_tokens_details.cached_tokens >= earlier
    assert client.responses.retrieve(previous).output_text == responses[-1].output_text
    assert client.responses.input_items.list(previous).data[0].content[0].text == QUESTIONS[-1]
    client.responses.delete(previous)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(previous)


def test_tokenize_detokenize_count_tokens_and_version_pass_through(routed) -> None:
    """``/tokenize``, ``/detokenize``, ``count_tokens``, ``/version`` and ``/v1/models/{id}``
    answer through the router as the replicas answer them."""
    front, replicas = routed
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
    via = httpx.post(f"{front.base_url}/tokenize", json=body).json()
    direct = httpx.post(f"{replicas[0].base_url}/tokenize", json=body).json()
    assert via == direct and via["count"] > 0
    text = httpx.post(f"{front.base_url}/detokenize", json={"model": "tiny", "tokens": via["tokens"]})
    assert text.status_code == 200 and "hello there" in text.json()["prompt"]
    messages = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
    counted = httpx.post(f"{front.base_url}/v1/messages/count_tokens", json=messages)
    assert counted.json() == {"input_tokens": via["count"]}
    assert counted.headers["x-kvproxy-route"] == "least_loaded"
    assert (
        httpx.get(f"{front.base_url}/version").json() == httpx.get(f"{replicas[0].base_url}/version").json()
    )
    client = OpenAI(base_url=f"{front.base_url}/v1", api_key="x", max_retries=0)
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_each_dialect_hashes_as_the_replica_renders(routed, tiny_model) -> None:
    """The router's token ids for a Messages body and a Responses body are the prompt the
    replica computes for it (its reported prompt length), client metadata left out as the replica
    leaves it out (``proxy.serving.metadata``)."""
    front, _ = routed
    identity = front.app.state.router.identity
    billing = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; cch=1c8b4;"
    messages = {
        "model": "tiny",
        "max_tokens": 4,
        "system": [{"type": "text", "text": billing}, {"type": "text", "text": "be kind"}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    reply = httpx.post(f"{front.base_url}/v1/messages", json=messages).json()
    used = reply["usage"]
    prompt = used["input_tokens"] + used["cache_read_input_tokens"] + used["cache_creation_input_tokens"]
    assert identity.prompt("messages", messages, "t").prompt_tokens == prompt
    responses = {"model": "tiny", "instructions": billing + "be kind", "input": "hi", "max_output_tokens": 4}
    reply = httpx.post(f"{front.base_url}/v1/responses", json=responses).json()
    assert identity.prompt("responses", responses, "t").prompt_tokens == reply["usage"]["input_tokens"]


def test_unknown_route_names_the_routes(routed) -> None:
    front, _ = routed
    r = httpx.get(f"{front.base_url}/v1/embeddings")
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "GET /v1/embeddings is not a route" in message
    assert "POST /v1/responses" in message and "POST /v1/messages" in message
