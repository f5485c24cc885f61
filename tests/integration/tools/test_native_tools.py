"""A template with native tool support (hermes: ``<tool_call>``, as Qwen's) on the tiny model:
the template renders the tools and the history's calls; ``required`` and a named tool decode
under a grammar into well-formed calls; the next turn's prompt holds the answer as generated."""

from __future__ import annotations

import dataclasses
import json

import pytest
from openai import OpenAI

from engine.model.loading import load_model
from tests.helpers import HANG_S, build_tiny_model

HERMES = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Return each call as a JSON object within <tool_call></tool_call> tags.<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}{% if not loop.first or message.content %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "days": {"type": "integer", "maximum": 9},
            },
            "required": ["city", "days"],
        },
    },
}
USER = [{"role": "user", "content": "Weather in Lima?"}]


@pytest.fixture(scope="module")
def hermes_model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-hermes"), chat_template=HERMES)
    loaded = load_model(str(path), cache_dir=tmp_path_factory.mktemp("cache"))
    return dataclasses.replace(loaded, name="tiny")


@pytest.fixture
def client(settings, hermes_model, serve):
    with serve(settings, hermes_model) as server:
        yield OpenAI(base_url=f"{server.base_url}/v1", api_key="unused"), server


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_native_calls_decode_under_a_grammar(client, choice) -> None:
    """``required`` / named: one well-formed ``<tool_call>`` per answer (parallel off), read back
    as ``tool_calls``; streamed pieces add up to the same call."""
    openai, _ = client
    kwargs = {"model": "tiny", "messages": USER, "tools": [WEATHER], "tool_choice": choice}
    for seed in range(4):
        reply = openai.chat.completions.create(**kwargs, seed=seed, parallel_tool_calls=False, max_tokens=300)
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message.content
        (call,) = reply.choices[0].message.tool_calls
        args = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and set(args) == {"city", "days"}
    chunks = list(
        openai.chat.completions.create(**kwargs, temperature=0, parallel_tool_calls=False, stream=True)
    )
    streamed = "".join(
        c.function.arguments or ""
        for ch in chunks
        if ch.choices
        for c in ch.choices[0].delta.tool_calls or []
    )
    whole = openai.chat.completions.create(**kwargs, temperature=0, parallel_tool_calls=False)
    assert json.loads(streamed) == json.loads(whole.choices[0].message.tool_calls[0].function.arguments)


def test_the_next_turn_reuses_the_call_as_generated(client) -> None:
    """The template renders the call it was given back (arguments as an object), so the next
    turn's prompt holds the answer and its K/V is reused."""
    openai, server = client
    first = openai.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    assert server.app.state.engine.flush_saves(HANG_S)
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = openai.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=3)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
