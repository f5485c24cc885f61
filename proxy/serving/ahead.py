"""Where a chat's later prompts will agree with this one, computed from the chat template itself.

- ``next_turn_start``: the conversation with this turn's answer, as the template will render it
  at the start of the next turn's prompt, whatever the next message says. The template is asked
  directly: the history plus the answer plus a user message, rendered with two different user
  messages; the tokens the two renderings share are the start. So the end-of-turn markers, and
  the reasoning a template drops from earlier turns (``<think>`` sections), come out exactly as
  the next prompt will have them. The engine computes it ahead (``engine.render_ahead``).
- ``system_boundary``: where the leading system messages end in the prompt; another
  conversation with the same system prompt shares every token up to there (a tail is stored
  there: ``GenerationRequest.boundaries``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from engine.requests import GenerationRequest
from engine.worker import Engine
from proxy.config import Settings
from proxy.tools.rendering import RenderError, TemplateMessage, render_chat

_PROBES = ("x", "7 " + "\n")
"""Two next messages that share no first character (letters, digits, spaces, newlines)."""


def next_turn_start(
    tokenizer: Any,
    messages: Sequence[TemplateMessage],
    answer: str,
    template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The token ids every next prompt of this chat starts with, once ``answer`` is the
    assistant's message after ``messages`` (empty when the template cannot render it)."""
    history = [*messages, {"role": "assistant", "content": answer}]
    try:
        a, b = (
            render_chat(
                tokenizer,
                [*history, {"role": "user", "content": probe}],
                tools=tools,
                template_kwargs=template_kwargs,
            )
            for probe in _PROBES
        )
    except RenderError:
        return []
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:shared]


def system_boundary(
    tokenizer: Any,
    messages: Sequence[TemplateMessage],
    prompt_ids: Sequence[int],
    template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[int, ...]:
    """The prompt position (tokens) where the leading system messages end, when the template
    renders them alone as the start of ``prompt_ids``; else none."""
    leading = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    if not 0 < leading < len(messages):
        return ()
    try:
        ids = render_chat(
            tokenizer,
            messages[:leading],
            add_generation_prompt=False,
            tools=tools,
            template_kwargs=template_kwargs,
        )
    except RenderError:
        return ()
    return (len(ids),) if 0 < len(ids) < len(prompt_ids) and list(prompt_ids[: len(ids)]) == ids else ()


def render_ahead(
    engine: Engine,
    tokenizer: Any,
    settings: Settings,
    messages: Sequence[TemplateMessage],
    generation: GenerationRequest,
    data: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Callable[[str], object] | None:
    """What ``proxy.serving.running.start`` calls with a chat turn's answer: the next turn's
    start, rendered on a worker thread, handed to the engine (``Engine.render_ahead``) with the
    request's tenant and TTLs (``tokenizer``: the served model's). None when the cache or
    render-ahead is off."""
    if engine.cache is None or settings.no_render_ahead:
        return None
    loop = asyncio.get_running_loop()

    def job(answer: str) -> None:
        ids = next_turn_start(tokenizer, messages, answer, data, tools)
        if len(ids) > len(generation.prompt_ids):
            ttls = generation.cache_ttl_s
            engine.render_ahead(
                GenerationRequest(tuple(ids), 1, tenant=generation.tenant, cache_ttl_s=ttls, prewarm=True)
            )

    return lambda answer: loop.run_in_executor(None, job, answer)
