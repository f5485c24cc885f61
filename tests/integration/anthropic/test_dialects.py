"""The dialects chat apps already speak: Anthropic's Messages API with the official ``anthropic``
client, the vLLM server's extra routes, ``--served-model-name`` and the vLLM-named metrics."""

from __future__ import annotations

import asyncio
import re

import anthropic
import httpx
import pytest
from openai import OpenAI

from tests.api import Api
from tests.helpers import TRAINING_TEXT, wait_for

SYSTEM = " ".join(TRAINING_TEXT) * 11  # about 1,050 tokens of the tiny tokenizer
QUESTIONS = ("What is a prefix cache?", "Why are blocks hashed?")


def client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0)


def ask(server, question: str, ttl: str = "5m", **extra):
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": ttl}}]
    return client(server).messages.create(
        model="tiny",
        max_tokens=12,
        extra_body={"temperature": 0},
        system=system,
        messages=[{"role": "user", "content": question}],
        **extra,
    )


def tokenize(server, question: str) -> list[int]:
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    return httpx.post(f"{server.base_url}/tokenize", json=body).json()["tokens"]


def total(usage) -> int:
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def test_anthropic_client_reads_the_cached_system_block(cached, cold) -> None:
    """The second question under a 1,000-token cached system block reads all of it, to its
    breakpoint (its blocks, then the tail stored there), and the turn's start after it that the
    first question's prompt shares; the first stored its whole prompt; the
    three usage figures add up to the prompt; the answer equals a --no-cache server's."""
    first_ids, second_ids = (tokenize(cached.server, q) for q in QUESTIONS)
    body = {"messages": [{"role": "system", "content": SYSTEM}], "add_generation_prompt": False}
    system = len(httpx.post(f"{cached.server.base_url}/tokenize", json=body).json()["tokens"])
    assert system >= 900 and first_ids[:system] == second_ids[:system]

    first = ask(cached.server, QUESTIONS[0])
    cached.flush()
    second = ask(cached.server, QUESTIONS[1])
    baseline = ask(cold.server, QUESTIONS[1])

    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens == len(first_ids)
    assert total(first.usage) == len(first_ids)
    # NOTE: to its breakpoint, and the template's start of the user turn the first question's
    # tail shares with it (a tail serves all it shares with a prompt)
    shared = next(i for i, (a, b) in enumerate(zip(first_ids, second_ids, strict=False)) if a != b)
    assert shared > system and second.usage.cache_read_input_tokens == shared
    assert total(second.usage) == len(second_ids)
    assert baseline.usage.cache_read_input_tokens == baseline.usage.cache_creation_input_tokens == 0
    assert second.content[0].text == baseline.content[0].text
    assert second.stop_reason == "max_tokens" and second.usage.output_tokens == 12


def test_anthropic_streaming_and_async_agree(cached) -> None:
    """Streaming yields the documented events in order; sync, async and streamed texts agree."""
    reply = ask(cached.server, QUESTIONS[0])
    with client(cached.server).messages.stream(
        model="tiny",
        max_tokens=12,
        extra_body={"temperature": 0},
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTIONS[0]}],
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()

    async def run_async():
        async with anthropic.AsyncAnthropic(base_url=cached.server.base_url, api_key="x") as aclient:
            return await aclient.messages.create(
                model="tiny",
                max_tokens=12,
                extra_body={"temperature": 0},
                system=SYSTEM,
                messages=[{"role": "user", "content": QUESTIONS[0]}],
            )

    async_reply = asyncio.run(run_async())
    raw = [k for k in kinds if not k.startswith("text") and k != "content_block_delta"]
    assert raw == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert kinds.count("content_block_delta") >= 1
    assert streamed.content[0].text == reply.content[0].text == async_reply.content[0].text
    assert total(streamed.usage) == total(reply.usage)
    assert streamed.usage.output_tokens == reply.usage.output_tokens


def test_cache_control_ttl_applies_to_the_blocks_it_covers(
    settings, tiny_model, serve, redis_client, key_prefix
):
    """A 1h breakpoint on the system block: its blocks live up to an hour; the blocks after it
    take the server's TTL; without a breakpoint every block takes the server's TTL."""
    with serve(settings.model_copy(update={"ttl": 60, "max_ttl": 7200}), tiny_model) as server:
        ask(server, QUESTIONS[0] + " " + SYSTEM[:600], ttl="1h")
        Api(server).flush()
        ttls = sorted(redis_client.ttl(k) for k in redis_client.scan_iter(f"{key_prefix}*:b:*"))
    long_lived = [t for t in ttls if t > 60]
    assert long_lived and all(t <= 3600 for t in long_lived)
    assert any(t <= 60 for t in ttls)  # the question's blocks, after the breakpoint


def test_anthropic_errors_name_the_field(cached) -> None:
    """A tool that is not an object, images, documents and thinking of an unknown type are 400 in
    Anthropic's error shape naming the field; an unknown model is a 404; bodies are validated as
    the Messages API does."""
    base = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    bad_ttl = {"type": "ephemeral", "ttl": "2h"}
    cases = [
        (base | {"tools": [{"type": "bash_20250124", "name": "bash"}, 7]}, 400, "tools[1]"),
        (base | {"thinking": {"type": "sometimes"}}, 400, "thinking.type"),
        (base | {"messages": [{"role": "user", "content": [image]}]}, 400, "messages[0].content[0].type"),
        (base | {"messages": [{"role": "user", "content": [document]}]}, 400, "messages[0].content[0].type"),
        (base | {"model": "nope"}, 404, "nope"),
        ({k: v for k, v in base.items() if k != "max_tokens"}, 400, "max_tokens"),
        (
            base | {"system": [{"type": "text", "text": "x", "cache_control": bad_ttl}]},
            400,
            "system[0].cache_control.ttl",
        ),
        (
            base
            | {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": bad_ttl}]}
                ]
            },
            400,
            "messages[0].content[0].cache_control.ttl",
        ),
    ]
    for body, status, named in cases:
        r = httpx.post(f"{cached.server.base_url}/v1/messages", json=body)
        assert r.status_code == status, r.text
        doc = r.json()
        assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}
        assert named in doc["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        client(cached.server).messages.create(**base, extra_body={"temperature": 3})
    answer = client(cached.server).messages.create(**base, thinking={"type": "disabled"})
    assert answer.id.startswith("msg_") and answer.usage.output_tokens > 0


def test_count_tokens_is_the_prompt_length(cached) -> None:
    """``/v1/messages/count_tokens`` (the anthropic client's ``count_tokens``) gives the prompt
    length the Messages route computes."""
    body = {"model": "tiny", "system": "be brief", "messages": [{"role": "user", "content": "hi there"}]}
    counted = client(cached.server).messages.count_tokens(**body)
    answer = client(cached.server).messages.create(**body, max_tokens=2)
    assert counted.input_tokens == total(answer.usage) > 0


def test_x_api_key_maps_to_the_same_tenant(settings, tiny_model, serve) -> None:
    """``x-api-key`` authenticates like Bearer and shares that key's tenant's cache."""
    with serve(settings.model_copy(update={"api_keys": "k1=team,k2=team"}), tiny_model) as server:
        OpenAI(base_url=f"{server.base_url}/v1", api_key="k1").chat.completions.create(
            model="tiny",
            max_tokens=2,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"}],
        )
        Api(server).flush()
        reply = client(server, "k2").messages.create(
            model="tiny", max_tokens=2, system=SYSTEM, messages=[{"role": "user", "content": "b"}]
        )
        assert reply.usage.cache_read_input_tokens >= 768
        with pytest.raises(anthropic.AuthenticationError) as denied:
            client(server, "wrong").messages.create(
                model="tiny", max_tokens=2, messages=[{"role": "user", "content": "b"}]
            )
        assert denied.value.body["type"] == "error"


def test_tokenize_counts_what_the_chat_route_computes(cached) -> None:
    """``/tokenize`` on a chat body gives the chat route's prompt ids; prompts and detokenize too."""
    base = cached.server.base_url
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "<|im_end|> hi"}]
    doc = httpx.post(f"{base}/tokenize", json={"model": "tiny", "messages": messages}).json()
    chat = OpenAI(base_url=f"{base}/v1", api_key="x").chat.completions.create(
        model="tiny", messages=messages, max_tokens=1
    )
    assert doc["count"] == len(doc["tokens"]) == chat.usage.prompt_tokens
    assert doc["max_model_len"] == 4096
    text = httpx.post(f"{base}/detokenize", json={"tokens": doc["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system\n" + SYSTEM[:40])
    plain = httpx.post(f"{base}/tokenize", json={"prompt": "hello", "add_special_tokens": False}).json()
    assert httpx.post(f"{base}/detokenize", json={"tokens": plain["tokens"]}).json()["prompt"] == "hello"
    assert httpx.post(f"{base}/detokenize", json={"tokens": [10**7]}).status_code == 400
    assert httpx.post(f"{base}/tokenize", json={"prompt": "a", "messages": messages}).status_code == 400
    assert re.fullmatch(r"\d+\.\d+.*", httpx.get(f"{base}/version").json()["version"])


def test_served_model_names_route_and_echo(settings, tiny_model, serve) -> None:
    """Every ``--served-model-name`` alias is listed with max_model_len, accepted and echoed."""
    with serve(
        settings.model_copy(update={"served_model_name": "team-llm, gpt-4o-mini"}), tiny_model
    ) as server:
        openai = OpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        listed = {m.id: m.model_extra for m in openai.models.list().data}
        reply = openai.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}], max_tokens=2
        )
        unknown = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "a"}]},
        )
    assert list(listed) == ["team-llm", "gpt-4o-mini"]
    assert all(extra["max_model_len"] == 4096 for extra in listed.values())
    assert reply.model == "gpt-4o-mini"
    assert unknown.status_code == 404


def scrape(server) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    samples = re.findall(r'^(vllm:\w+)\{model_name="tiny"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in samples}


def finished(server, reason: str) -> float:
    """``vllm:request_success_total`` of ``reason``."""
    pattern = rf'^vllm:request_success_total{{[^}}]*finished_reason="{reason}"[^}}]*}} (\S+)'
    return sum(float(v) for v in re.findall(pattern, httpx.get(f"{server.base_url}/metrics").text, re.M))


def test_a_stream_its_client_leaves_is_counted_as_cancelled(cached) -> None:
    """A streaming client that closes the connection mid-answer reads no ``Finished`` event; its
    request is still counted, as ``cancelled``, once the engine has stopped it."""
    before = finished(cached.server, "cancelled")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}
    url = f"{cached.server.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body | {"stream": True, "temperature": 0}, timeout=60) as reply:
        for i, _ in enumerate(reply.iter_lines()):
            if i == 6:
                break
    wait_for(lambda: finished(cached.server, "cancelled") != before, what="the request to be counted")
    assert finished(cached.server, "cancelled") == before + 1


def test_vllm_metrics_move_by_the_usage(cached) -> None:
    """The vLLM-named series move by exactly what the responses' usage says."""
    openai = OpenAI(base_url=f"{cached.server.base_url}/v1", api_key="x")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"}]
    openai.chat.completions.create(model="tiny", messages=messages, max_tokens=3)
    cached.flush()
    before = scrape(cached.server)
    replies = [openai.chat.completions.create(model="tiny", messages=messages, max_tokens=n) for n in (2, 5)]
    after = scrape(cached.server)

    def moved(name: str) -> float:
        return after[name] - before[name]

    assert moved("vllm:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in replies)
    assert moved("vllm:prefix_cache_queries_total") == sum(r.usage.prompt_tokens for r in replies)
    cached_tokens = sum(r.usage.prompt_tokens_details.cached_tokens for r in replies)
    assert cached_tokens > 0 and moved("vllm:prefix_cache_hits_total") == cached_tokens
    assert moved("vllm:generation_tokens_total") == sum(r.usage.completion_tokens for r in replies)
    assert moved("vllm:e2e_request_latency_seconds_count") == 2
    assert moved("vllm:time_to_first_token_seconds_count") == 2
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1
