"""OpenAI bodies as turns (``proxy.serving.turn``): a chat completion, a completion, and the chat
messages of ``/tokenize``, prewarm, export and the Responses API's continuations. Each body is
translated here once; the core renders and runs the turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    unsupported_content,
)
from proxy.openai.tools import answer_schema, chat_tools, check_history, function_tools
from proxy.serving.facts import ModelFacts
from proxy.serving.metadata import LeftOut, chat_without_metadata
from proxy.serving.prompts import render_turn
from proxy.serving.turn import Params, Sampling, Turn
from proxy.serving.validation import cache_ttl, check_model
from proxy.tools.spec import ToolSet

CHAT_PARAMS = Params("messages", "tools[{i}].function.parameters", "response_format.json_schema.schema")
"""Where a chat completion's errors are named."""


def check_body(facts: ModelFacts, body: SamplingFields) -> None:
    """404 for another model, 400 naming the first field this server cannot honour."""
    check_model(facts, body.model)
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")


def sampling(body: SamplingFields) -> Sampling:
    """The body's sampling fields."""
    return Sampling(
        body.temperature,
        body.top_p,
        body.seed,
        body.presence_penalty,
        body.frequency_penalty,
        body.logit_bias,
    )


def chat_answer(body: ChatCompletionRequest) -> tuple[ToolSet | None, dict[str, Any] | None]:
    """The chat's tools and answer schema, its history's calls checked (run it off the event
    loop: the schema walks are linear and bounded, but a body holds megabytes).

    Raises:
        OpenAIError: 400 naming the field: a bad tool, tool choice or ``response_format``, both
            callable tools and a ``response_format``, a malformed call or result in the history.
    """
    tools, schema = chat_tools(body), answer_schema(body)
    if schema is not None and tools is not None and tools.mode != "none":
        raise OpenAIError(
            400,
            "response_format with callable tools is not supported; send one or the other",
            param="response_format",
        )
    check_history(body.messages)
    return tools, schema


def chat_turn(
    body: ChatCompletionRequest,
    settings: Settings,
    tenant: str,
    answer: tuple[ToolSet | None, dict[str, Any] | None],
    params: Params = CHAT_PARAMS,
    prompt_of: Callable[[list[int]], list[int]] | None = None,
    to_window: bool = False,
) -> Turn:
    """A chat completion as a turn, with its tools and answer schema (``chat_answer``; a
    ``json_schema`` without ``strict: true`` is not strict: ``Turn.schema_strict``; ``prompt_of``
    and ``to_window`` as ``Turn`` has them); known client metadata at the start of a system
    message left out unless ``--keep-client-metadata`` (``proxy.serving.metadata``: such as an
    Anthropic client's header a gateway passed on)."""
    tools, schema = answer
    form = body.response_format
    spec = form.json_schema if form is not None and form.type == "json_schema" else None
    messages = body.template_messages()
    left_out: tuple[LeftOut, ...] = ()
    if not settings.keep_client_metadata:
        messages, left_out = chat_without_metadata(messages)
    return Turn(
        body.model,
        tenant,
        messages=messages,
        tools=tools,
        schema=schema,
        schema_strict=not isinstance(spec, dict) or bool(spec.get("strict")),
        sampling=sampling(body),
        max_tokens=body.max_completion_tokens or body.max_tokens,
        to_window=to_window,
        stop=body.stop_strings(),
        ttl=cache_ttl(settings, body.prompt_cache_retention),
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
        template_kwargs=body.chat_template_kwargs,
        params=params,
        prompt_of=prompt_of,
        left_out=left_out,
    )


def completion_turn(body: CompletionRequest, settings: Settings, tenant: str) -> Turn:
    """A completion as a turn: its prompt taken as is."""
    return Turn(
        body.model,
        tenant,
        prompt=body.prompt,
        sampling=sampling(body),
        max_tokens=body.max_tokens,
        stop=body.stop_strings(),
        ttl=cache_ttl(settings, body.prompt_cache_retention),
        top_logprobs=body.logprobs or 0,
        params=Params(prompt="prompt"),
    )


def messages_prompt_ids(
    tokenizer: Any,
    vocab_size: int,
    messages: list[ChatMessage],
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
    tools: list[Any] | None = None,
) -> list[int]:
    """Chat messages (text content only) and OpenAI ``tools`` rendered as the chat route renders
    them.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render, a content part that
            is not text, or a bad tool.
    """
    if (unsupported := unsupported_content(messages)) is not None:
        raise OpenAIError(400, unsupported[1], param=unsupported[0])
    check_history(messages)
    toolset = ToolSet(tuple(function_tools(tools))) if tools else None
    # NOTE: a turn to render only: no model or tenant is asked of it
    turn = Turn(
        "",
        "",
        messages=[m.for_template() for m in messages],
        tools=toolset,
        template_kwargs=template_kwargs,
        generation_prompt=add_generation_prompt,
    )
    return render_turn(tokenizer, vocab_size, turn).ids


def prompt_ids(
    tokenizer: Any,
    vocab_size: int,
    messages: list[ChatMessage] | None,
    prompt: str | list[int] | None,
    add_generation_prompt: bool = True,
    tools: list[Any] | None = None,
) -> list[int]:
    """``messages`` (with ``tools``) as the chat route renders them, else ``prompt`` as
    completions takes it."""
    if messages is not None:
        return messages_prompt_ids(tokenizer, vocab_size, messages, add_generation_prompt, tools=tools)
    turn = Turn("", "", prompt=prompt or [], params=Params(prompt="prompt"))
    return render_turn(tokenizer, vocab_size, turn).ids
