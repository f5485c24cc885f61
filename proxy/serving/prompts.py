"""A turn's prompt as token ids: the one place every route's prompt is built, so the chat routes,
completions, prewarm, export and ``/tokenize`` all compute the same ids for the same turn.

Chats are rendered by ``proxy.tools.rendering`` (the model's chat template, message text always
tokenized as text), with the tools written in as ``proxy.tools.prompt`` writes them; prompt
strings are tokenized with the tokenizer's own special tokens; token id prompts are checked
against the vocabulary. Every fault is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hashing import BLOCK_SIZE
from proxy.http.errors import OpenAIError
from proxy.serving.ahead import system_boundary
from proxy.serving.turn import Rendered, Turn
from proxy.tools.formats import tool_format
from proxy.tools.prompt import tool_messages, tools_span
from proxy.tools.rendering import RenderError, render_chat
from store.interface import TtlPlan


def render_turn(tokenizer: Any, vocab_size: int, turn: Turn) -> Rendered:
    """``turn``'s prompt: its chat rendered (the tools written in), or its raw prompt tokenized
    or checked; ``Turn.prompt_of`` applied.

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render, or a token id
            outside the vocabulary.
    """
    if turn.messages is None:
        ids = completion_ids(tokenizer, vocab_size, turn.prompt or [], turn.params.prompt)
        return Rendered(ids, ids)
    messages, tools = tool_messages(turn.messages, turn.tools, tool_format(tokenizer))
    try:
        ids = render_chat(
            tokenizer,
            messages,
            add_generation_prompt=turn.generation_prompt,
            tools=tools,
            template_kwargs=turn.template_kwargs,
            continue_final_message=turn.prefill is not None,
        )
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc
    prompt = ids if turn.prompt_of is None else turn.prompt_of(ids)
    return Rendered(prompt, ids, messages, tools, turn.template_kwargs)


def layout(tokenizer: Any, turn: Turn, prompt: Rendered, max_ttl: int) -> tuple[TtlPlan, tuple[int, ...]]:
    """The TTL plan of ``prompt``'s blocks and the positions where a tail is stored: the turn's
    cache marks (each TTL capped at ``max_ttl``), where the leading system messages end, and the
    turn's own boundaries.

    A mark covers the message that holds it: its position is the length of the prompt rendered
    up to that message, when that rendering is a prefix of the whole prompt (chat templates
    render turn after turn); else it covers the whole prompt. A mark on the tools covers the
    tool definitions (``proxy.tools.prompt.tools_span``).

    Raises:
        OpenAIError: 400 naming the field the chat template cannot render.
    """
    if turn.messages is None:
        return turn.ttl, turn.boundaries
    ids, fmt, marks = prompt.rendered, tool_format(tokenizer), []
    try:
        for mark in turn.marks:
            if mark.message is None:
                continue
            head_messages, head_tools = tool_messages(turn.messages[: mark.message + 1], turn.tools, fmt)
            head = render_chat(
                tokenizer,
                head_messages,
                tools=head_tools,
                add_generation_prompt=False,
                template_kwargs=turn.template_kwargs,
            )
            marks.append((len(head) if ids[: len(head)] == head else len(ids), min(mark.ttl_s, max_ttl)))
        on_tools = [min(mark.ttl_s, max_ttl) for mark in turn.marks if mark.message is None]
        if turn.tools is not None and on_tools:
            end = tools_span(tokenizer, turn.messages, turn.tools, fmt, ids, turn.template_kwargs)[1]
            marks += [(end, ttl) for ttl in on_tools]
    except RenderError as exc:
        raise OpenAIError(400, exc.message, param=exc.param) from exc
    system = system_boundary(tokenizer, prompt.messages, prompt.ids, prompt.data, prompt.tools)
    boundaries = {p for p, _ in marks} | set(system) | set(turn.boundaries)
    ttl = (ttl_plan(len(ids), sorted(marks)) or None) if turn.marks else turn.ttl
    return ttl, tuple(sorted(boundaries))


def ttl_plan(prompt_tokens: int, marks: list[tuple[int, int]]) -> tuple[int | None, ...]:
    """The TTL plan of a prompt with cache marks ``(token position where the marked content
    ends, TTL)``: each full block ending at or before a mark takes that mark's TTL (the first
    one that covers it), and a block a mark falls inside the longest of that and theirs, so the
    tail stored where marked content ends (``hashing.tails``: it takes the TTL of the block it
    would be) keeps its TTL; later blocks take the server's (None)."""
    plan: list[int | None] = []
    for i in range(-(-prompt_tokens // BLOCK_SIZE)):
        start, end = i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE
        covering = next((ttl for position, ttl in marks if position >= end), None)
        inside = [ttl for position, ttl in marks if start < position < end]
        plan.append(max([*inside, *([covering] if covering is not None else [])], default=None))
    while plan and plan[-1] is None:
        plan.pop()
    return tuple(plan)


def completion_ids(
    tokenizer: Any, vocab_size: int, prompt: str | list[int], param: str = "prompt"
) -> list[int]:
    """A completion's prompt: a string tokenized as is (with the tokenizer's own special
    tokens), a list of ids checked against the vocabulary.

    Raises:
        OpenAIError: 400 for a token id outside ``[0, vocab_size)``.
    """
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    check_token_ids(vocab_size, prompt, param)
    return list(prompt)


def check_token_ids(vocab_size: int, ids: Sequence[int], param: str) -> None:
    """Raises OpenAIError (400, naming ``param``) for a token id outside the vocabulary."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise OpenAIError(400, f"token id {bad} is outside the vocabulary [0, {vocab_size})", param=param)
