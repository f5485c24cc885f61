"""A ``GenerateContentRequest`` read once as the neutral turn the core runs
(``proxy.serving.turn``): its contents (a named cache's first) as chat messages, and its
generation config as sampling, ``max_tokens`` and stop strings. Imports no engine: ``kvproxy
route`` reads Gemini's contents with the same ``chat_messages``.
"""

from __future__ import annotations

from proxy.gemini.protocol import GenerateContentRequest, GenerationConfig, chat_messages, refuse_unsupported
from proxy.http.errors import OpenAIError
from proxy.serving.turn import Params, Sampling, Turn
from proxy.tools.rendering import TemplateMessage

PARAMS = Params(prompt="contents")
"""Where a Gemini body's errors about its prompt are named."""


def contents_messages(body: GenerateContentRequest) -> list[TemplateMessage]:
    """The body's system instruction and contents as chat messages.

    Raises:
        OpenAIError: 400 naming a field Gemini's routes cannot honour here
            (``proxy.gemini.protocol.UNSUPPORTED``), a part that is not text, or no contents.
    """
    refuse_unsupported(body)
    messages = chat_messages(body.system_instruction, body.contents)
    if not body.contents:
        raise OpenAIError(400, "contents: at least one content is required", param="contents")
    return messages


def sampling(config: GenerationConfig) -> Sampling:
    """A generation config's sampling fields."""
    return Sampling(
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
        presence_penalty=config.presence_penalty,
        frequency_penalty=config.frequency_penalty,
    )


def gemini_turn(
    body: GenerateContentRequest, model: str, tenant: str, messages: list[TemplateMessage]
) -> Turn:
    """The body as a turn over ``messages`` (``contents_messages``, a named cache's first): at
    most ``maxOutputTokens`` (None: up to the context), ``stopSequences``; blocks kept the
    server's ``--ttl``."""
    config = body.generation_config
    return Turn(
        model,
        tenant,
        messages=messages,
        sampling=sampling(config),
        max_tokens=config.max_output_tokens,
        stop=tuple(config.stop_sequences or ()),
        params=PARAMS,
    )
