"""Where a chat's later prompts will agree with this one, computed from the chat template itself.

- ``next_turn_start``: the conversation with this turn's answer, as the template will render it
  at the start of the next turn's prompt, whatever the next message says. The template is asked
  directly: the history plus the answer plus a user message, rendered with two different user
  messages; the tokens the two renderings share are the start. So the end-of-turn markers, and
  the reasoning a template drops from earlier turns (``<think>`` sections), come out exactly as
  the next prompt will have them. The engine computes it ahead (``engine.render_ahead``, asked
  by ``proxy.serving.starting.render_ahead``).
- ``system_boundary``: where the leading system messages end in the prompt; another
  conversation with the same system prompt shares every token up to there (a tail is stored
  there: ``GenerationRequest.boundaries``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.tools.rendering import RenderError, TemplateMessage, render_chat
from proxy.tools.spec import OpenAITool

_PROBES = ("x", "7 " + "\n")
"""Two next messages that share no first character (letters, digits, spaces, newlines)."""


def next_turn_start(
    tokenizer: Any,
    messages: Sequence[TemplateMessage],
    answer: TemplateMessage,
    template_kwargs: dict[str, Any] | None = None,
    tools: list[OpenAITool] | None = None,
) -> list[int]:
    """The token ids every next prompt of this chat starts with, once ``answer`` is the
    assistant's message after ``messages`` as the next request's history renders it
    (``proxy.tools.prompt.answer_turn``; empty when the template cannot render it)."""
    history = [*messages, answer]
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
    tools: list[OpenAITool] | None = None,
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
