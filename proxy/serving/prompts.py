"""A request's prompt as token ids: the one place each route's prompt is built, so the chat
route, completions, prewarm, export and ``/tokenize`` all compute the same ids for the same body.

Chats are rendered by ``proxy.serving.rendering`` (the model's chat template, message text always
tokenized as text); prompt strings are tokenized with the tokenizer's own special tokens; token
id prompts are checked against the vocabulary. Every fault is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.worker import Engine
from proxy.http.errors import OpenAIError
from proxy.openai.protocol import ChatCompletionRequest, ChatMessage
from proxy.serving.rendering import RenderError, render_chat, render_messages


def chat_prompt_ids(engine: Engine, body: ChatCompletionRequest) -> list[int]:
    """A chat completion's messages rendered with the generation prompt.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    try:
        messages, data = body.template_messages(), body.chat_template_kwargs
        return render_chat(engine.loaded.tokenizer, messages, template_kwargs=data)
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc


def messages_prompt_ids(
    engine: Engine,
    messages: list[ChatMessage],
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Chat messages rendered as the chat route renders them (text content only).

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    try:
        tokenizer = engine.loaded.tokenizer
        return render_messages(tokenizer, messages, add_generation_prompt, template_kwargs)
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
) -> list[int]:
    """``messages`` as the chat route renders them, else ``prompt`` as completions takes it."""
    if messages is not None:
        return messages_prompt_ids(engine, messages, add_generation_prompt)
    return completion_prompt_ids(engine, prompt or [])


def check_token_ids(engine: Engine, ids: Sequence[int], param: str) -> None:
    """Raises OpenAIError (400, naming ``param``) for a token id outside the vocabulary."""
    vocab = engine.loaded.model.config.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise OpenAIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param=param)
