"""A request's prompt as token ids: the one place each route's prompt is built, so the chat
route, completions, prewarm, export and ``/tokenize`` all compute the same ids for the same body.

Chats are rendered by ``proxy.serving.rendering`` (the model's chat template, message text always
tokenized as text); prompt strings are tokenized with the tokenizer's own special tokens; token
id prompts are checked against the vocabulary. Every fault is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.worker import Engine
from proxy.http.errors import OpenAIError
from proxy.openai.protocol import ChatCompletionRequest, ChatMessage, unsupported_content
from proxy.openai.tools import check_history, function_tools
from proxy.serving.rendering import RenderError, render_chat
from proxy.tools.formats import tool_format
from proxy.tools.prompt import tool_messages
from proxy.tools.spec import ToolSet


@dataclass(frozen=True)
class ChatPrompt:
    """A chat as rendered: its token ids, the messages and tool definitions the template got
    (``proxy.tools.prompt``), and the template's data."""

    ids: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    data: dict[str, Any] | None


def chat_prompt(engine: Engine, body: ChatCompletionRequest, tools: ToolSet | None) -> ChatPrompt:
    """A chat completion's messages and ``tools`` rendered with the generation prompt.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    check_history(body.messages)
    tokenizer = engine.loaded.tokenizer
    messages, template_tools = tool_messages(body.template_messages(), tools, tool_format(tokenizer))
    try:
        ids = render_chat(
            tokenizer, messages, tools=template_tools, template_kwargs=body.chat_template_kwargs
        )
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc
    return ChatPrompt(ids, messages, template_tools, body.chat_template_kwargs)


def messages_prompt_ids(
    engine: Engine,
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
    tokenizer = engine.loaded.tokenizer
    toolset = ToolSet(tuple(function_tools(tools))) if tools else None
    rendered, template_tools = tool_messages(
        [m.for_template() for m in messages], toolset, tool_format(tokenizer)
    )
    try:
        return render_chat(
            tokenizer,
            rendered,
            add_generation_prompt=add_generation_prompt,
            tools=template_tools,
            template_kwargs=template_kwargs,
        )
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc


def completion_prompt_ids(engine: Engine, prompt: str | list[int], param: str = "prompt") -> list[int]:
    """A completion's prompt: a string tokenized as is (with the tokenizer's own special
    tokens), a list of ids checked against the vocabulary.

    Raises:
        OpenAIError: 400 for a token id outside ``[0, vocab_size)``.
    """
    if isinstance(prompt, str):
        return list(engine.loaded.tokenizer(prompt)["input_ids"])
    check_token_ids(engine, prompt, param)
    return list(prompt)


def prompt_ids(
    engine: Engine,
    messages: list[ChatMessage] | None,
    prompt: str | list[int] | None,
    add_generation_prompt: bool = True,
    tools: list[Any] | None = None,
) -> list[int]:
    """``messages`` (with ``tools``) as the chat route renders them, else ``prompt`` as
    completions takes it."""
    if messages is not None:
        return messages_prompt_ids(engine, messages, add_generation_prompt, tools=tools)
    return completion_prompt_ids(engine, prompt or [])


def check_token_ids(engine: Engine, ids: Sequence[int], param: str) -> None:
    """Raises OpenAIError (400, naming ``param``) for a token id outside the vocabulary."""
    vocab = engine.loaded.model.config.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise OpenAIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param=param)
