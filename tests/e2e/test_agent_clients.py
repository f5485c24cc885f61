"""Agents on the default model through clients no one here wrote: LangChain (``bind_tools``,
``with_structured_output``), the anthropic SDK and the OpenAI Agents SDK get well-formed calls
or schema-valid JSON on every request; an agent loop reuses its system prompt, tools and history
turn after turn, with the answers of a ``--no-cache`` server."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json

import anthropic
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel

from tests.helpers import HANG_S

MODEL = "smollm2-135m-instruct"
# NOTE: greedy, as agent loops run: a 135M model sampled at temperature 1 can write a string
# argument until max_tokens, which no grammar can close in time (every client below runs greedy)
N = 20  # requests per client and mode
RUNS = 10  # agent runs on the Responses model per mode
CITIES = (
    "Paris Rome Oslo Lima Cairo Tokyo Berlin Madrid Lisbon Dublin Vienna Prague Athens Seoul Delhi "
    "Nairobi Quito Havana Warsaw Helsinki"
).split()
NAMES = (
    "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Karl Lena Mona Nina Omar Paul Rosa Sam Tina Uma"
).split()


@tool
def get_weather(city: str, days: int) -> str:
    """Get the weather forecast for a city for a number of days."""
    return "sunny"


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture
def server(settings, default_model, serve):
    with serve(settings, default_model) as running:
        yield running


def _weather_call(call: dict) -> bool:
    return (
        call["name"] == "get_weather"
        and set(call["args"]) == {"city", "days"}
        and isinstance(call["args"]["days"], int)
    )


@pytest.mark.parametrize("stream", [False, True])
def test_langchain_bind_tools(server, stream) -> None:
    """``bind_tools(..., tool_choice="required")``: 20 of 20 answers are a well-formed call."""
    llm = ChatOpenAI(
        base_url=f"{server.base_url}/v1", api_key="x", model=MODEL, max_tokens=120, temperature=0
    )
    bound = llm.bind_tools([get_weather], tool_choice="required")
    for i in range(N):
        question = f"What is the weather in {CITIES[i]} for {i % 5 + 1} days?"
        if stream:
            chunks = list(bound.stream(question))
            message = chunks[0]
            for chunk in chunks[1:]:
                message = message + chunk
        else:
            message = bound.invoke(question)
        assert message.tool_calls and all(_weather_call(c) for c in message.tool_calls), message


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
@pytest.mark.parametrize("stream", [False, True])
def test_langchain_structured_output(server, method, stream) -> None:
    """``with_structured_output(Person)``, by tool call and by JSON schema: 20 of 20 parse."""
    llm = ChatOpenAI(
        base_url=f"{server.base_url}/v1", api_key="x", model=MODEL, max_tokens=120, temperature=0
    )
    structured = llm.with_structured_output(Person, method=method)
    for i in range(N):
        question = f"{NAMES[i]} is {20 + i} years old. Extract the person."
        result = list(structured.stream(question))[-1] if stream else structured.invoke(question)
        assert isinstance(result, Person), result


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_tools(server, stream) -> None:
    """The anthropic SDK with ``tools`` and ``tool_choice: any``: 20 of 20 end in ``tool_use``."""
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x")
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    weather = {"name": "get_weather", "description": "Get the weather", "input_schema": schema}
    for i in range(N):
        kwargs = {
            "model": MODEL,
            "max_tokens": 120,
            "tools": [weather],
            "tool_choice": {"type": "any"},
            "messages": [{"role": "user", "content": f"Weather in {CITIES[i]} for {i % 5 + 1} days?"}],
            "extra_body": {"temperature": 0},  # NOTE: anthropic 2.x takes temperature only so
        }
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert reply.stop_reason == "tool_use" and uses, reply
        assert all(set(u.input) == {"city", "days"} for u in uses)


def test_openai_agents_sdk_function_tool(server) -> None:
    """The Agents SDK on the chat-completions model, ``tool_choice="required"``: 20 of 20 runs
    call the function with valid arguments and finish."""
    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def lookup_weather(city: str) -> str:
        """Look up the weather in a city."""
        seen.append(city)
        return f"It is sunny in {city}."

    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
    agent = Agent(
        name="weather",
        instructions="Use the tool to answer.",
        tools=[lookup_weather],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )

    async def run_all() -> list[str]:
        return [
            (await Runner.run(agent, f"What's the weather in {CITIES[i]}?")).final_output for i in range(N)
        ]

    outputs = asyncio.run(run_all())
    assert len(seen) == N and all(o.startswith("It is sunny in") for o in outputs)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_agents_sdk_default_responses_model(server, stream) -> None:
    """The Agents SDK on its default model class, ``OpenAIResponsesModel`` (``/v1/responses``):
    10 of 10 runs call the function with valid arguments and finish; a follow-up run chained by
    ``previous_response_id`` sends only its new question, and reuses the first run's prompt."""
    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def lookup_weather(city: str) -> str:
        """Look up the weather in a city."""
        seen.append(city)
        return f"It is sunny in {city}."

    model = OpenAIResponsesModel(
        model=MODEL, openai_client=AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
    )
    settings = ModelSettings(max_tokens=120, temperature=0)
    agent = Agent(
        name="weather",
        instructions="Use the tool to answer.",
        tools=[lookup_weather],
        model=model,
        model_settings=settings.resolve(ModelSettings(tool_choice="required")),
        tool_use_behavior="stop_on_first_tool",
    )

    async def run(agent: Agent, question: str, **kwargs: object) -> object:
        if not stream:
            return await Runner.run(agent, question, **kwargs)
        result = Runner.run_streamed(agent, question, **kwargs)
        async for _ in result.stream_events():
            pass
        return result

    async def run_all() -> tuple[list[str], object, object]:
        outputs = [
            (await run(agent, f"What's the weather in {city}?")).final_output for city in CITIES[:RUNS]
        ]
        first = await run(agent, "What's the weather in Paris?")
        follow = await run(agent, "And in Rome?", previous_response_id=first.last_response_id)
        return outputs, first, follow

    outputs, first, follow = asyncio.run(run_all())
    assert len(seen) == RUNS + 2 and all(o.startswith("It is sunny in") for o in outputs)
    assert follow.final_output == "It is sunny in Rome." and seen[-1] == "Rome"
    cached = follow.raw_responses[-1].usage.input_tokens_details.cached_tokens
    assert cached >= first.raw_responses[-1].usage.input_tokens, cached


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_section",
            "description": "Read one section",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "string"}},
                "required": ["title"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "count_words",
            "description": "Count the words of a text",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "unique": {"type": "boolean"}},
                "required": ["text"],
            },
        },
    },
]


def test_agent_loop_reuses_system_tools_and_history(settings, default_model, serve) -> None:
    """Five turns (a ~1,000-token system prompt, 3 tools, calls and results in the history):
    turns 2-5 report cached tokens covering everything before their new messages, and every
    answer equals a ``--no-cache`` server's."""
    system = (inspect.getdoc(argparse) or "")[:4200]
    no_cache = settings.model_copy(update={"no_cache": True})
    with serve(settings, default_model) as warm, serve(no_cache, default_model) as cold:
        clients = [OpenAI(base_url=f"{s.base_url}/v1", api_key="x") for s in (warm, cold)]
        messages: list[dict] = [
            {"role": "system", "content": system},
            {"role": "user", "content": "How do I add an optional flag?"},
        ]
        before = 0
        for turn in range(5):
            choice = "required" if turn % 2 == 0 else "auto"
            replies = [
                c.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    tools=TOOLS,
                    tool_choice=choice,
                    temperature=0,
                    max_tokens=60,
                )
                for c in clients
            ]
            warm_calls, cold_calls = (
                [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls or []]
                for r in replies
            )
            assert (
                warm_calls == cold_calls
                and replies[0].choices[0].message.content == replies[1].choices[0].message.content
            )
            usage = replies[0].usage
            if turn:  # everything before this turn's answer and new messages
                assert usage.prompt_tokens_details.cached_tokens >= before, (turn, usage)
            message = replies[0].choices[0].message
            if message.tool_calls:
                calls = [t.model_dump() for t in message.tool_calls]
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
                for call in message.tool_calls:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id,
                            "content": json.dumps({"result": f"section {turn}"}),
                        }
                    )
            else:
                messages.append({"role": "assistant", "content": message.content})
                messages.append({"role": "user", "content": "Now check it with a tool."})
            before = usage.prompt_tokens
            assert warm.app.state.engine.flush_saves(HANG_S)
