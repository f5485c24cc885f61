"""Chat messages -> prompt token ids, the one way every route (and the router) renders a chat.

The model's chat template writes the turns; its own markers (``<|im_start|>``, BOS, ...) are the
only special tokens in the prompt. Text that came from a message is always tokenized as text: a
user who writes ``<|im_end|>`` gets those characters, never the control token, so no message can
close its own turn and forge another. This holds for every special token the tokenizer knows.
"""

from __future__ import annotations

import inspect
import re
import secrets
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, TemplateError, meta

if TYPE_CHECKING:
    from proxy.tools.spec import OpenAITool

# NOTE: a mark is Unicode private-use characters around a random nonce and a number: no template
# filter (trim, upper, ...) changes it, no special token contains it, and no message can forge one
# (the nonce is new for every rendering).
_OPEN, _CLOSE = "\ue000", "\ue001"

TemplateMessage = dict[str, Any]
"""One chat message as chat templates take it: ``role``, ``content`` (a string or text parts)
and, for tool turns, ``tool_calls``/``tool_call_id``/``name``."""


REJECTED = "the chat template rejected the messages"
"""How a ``RenderError`` of a template that raised begins (its own message follows)."""


class RenderError(Exception):
    """The messages cannot be rendered; ``param`` names the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


def render_chat(
    tokenizer: Any,
    messages: Sequence[TemplateMessage],
    *,
    add_generation_prompt: bool = True,
    tools: list[OpenAITool] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    continue_final_message: bool = False,
) -> list[int]:
    """The chat template rendered over ``messages`` (dicts with ``role``, ``content`` and, for an
    assistant's tool calls, ``tool_calls``), as token ids; ``template_kwargs`` (a request's
    ``chat_template_kwargs``) pass only as ``template_data`` allows, their text protected as
    message text is. With ``continue_final_message`` (an assistant's prefill: the last message, its
    ``content`` a string), the prompt ends with that message's text, its turn left open (no
    end-of-turn, no generation prompt), as transformers' ``continue_final_message`` renders it.

    NOTE: the template writes every special token it wants (BOS, role markers), so the tokenizer
    adds none of its own (``add_special_tokens=False``): no doubled BOS.

    Raises:
        RenderError: no chat template; tool calls the template cannot render (never dropped);
            the template rejects the messages; a final message it does not write as given.
    """
    if not tokenizer.chat_template:
        raise RenderError("messages", "this model has no chat template; use /v1/completions")
    hidden: list[str] = []
    nonce = secrets.token_hex(8)
    # NOTE: tool definitions and calls are text from the request too
    protected = [
        dict(m)
        | {"content": _protect(tokenizer, m.get("content"), hidden, nonce)}
        | (
            {"tool_calls": _protect_data(tokenizer, m["tool_calls"], hidden, nonce)}
            if m.get("tool_calls")
            else {}
        )
        for m in messages
    ]
    tools = None if tools is None else _protect_data(tokenizer, tools, hidden, nonce)
    # NOTE: the open turn ends at a mark after the final message's text, not at the text itself:
    # text such as "im_end" also occurs in the end-of-turn marker after it
    end = f"{_OPEN}{nonce}end{_CLOSE}"
    if continue_final_message:
        if not protected or not isinstance(protected[-1].get("content"), str):
            raise RenderError("messages", "only a final message of text can be continued")
        protected[-1]["content"] += end
        add_generation_prompt = False
    for i, message in enumerate(protected):
        for field in ("tool_calls", "function_call"):
            if message.get(field) and not supports_tools(tokenizer):
                raise RenderError(
                    f"messages[{i}].{field}",
                    f"this model's chat template cannot render `{field}` (they would be dropped)",
                )
    data = template_data(tokenizer, template_kwargs)
    try:
        text = tokenizer.apply_chat_template(
            protected,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **{k: _protect_data(tokenizer, v, hidden, nonce) for k, v in data.items()},
        )
    # NOTE: a template is code (an operator's --chat-template too): whatever it raises while it
    # renders (an index, raise_exception, a division by zero, the sandbox's range limit) refuses
    # the messages; it is never a 500
    except (TemplateError, LookupError, TypeError, ValueError, ArithmeticError, AttributeError) as exc:
        raise RenderError("messages", f"{REJECTED}: {type(exc).__name__}: {exc}") from exc
    if continue_final_message:
        if text.count(end) != 1:
            raise RenderError(
                f"messages[{len(messages) - 1}].content",
                "the model's chat template does not write the final message as sent: it cannot be continued",
            )
        text = text[: text.index(end)]
    ids: list[int] = []
    for i, piece in enumerate(re.split(f"{_OPEN}{nonce}([0-9]+){_CLOSE}", text)):
        if i % 2 == 0:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
        else:
            as_text = tokenizer(hidden[int(piece)], add_special_tokens=False, split_special_tokens=True)
            ids += as_text["input_ids"]
    return ids


def template_data(tokenizer: Any, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The entries of a request's ``chat_template_kwargs`` that reach the chat template: plain JSON
    data (strings, numbers, booleans, null, lists and objects of them) under names the model's own
    template reads, never one of ``apply_chat_template``'s own parameters (``chat_template``,
    ``tokenize``, ...) or a special token's name (``bos_token``, ...). Everything else is dropped,
    so a request can never hand the renderer a template, and the router renders what a replica
    renders.
    """
    if not kwargs:
        return {}
    allowed = _template_variables(tokenizer.chat_template) - _reserved(tokenizer)
    return {k: v for k, v in kwargs.items() if k in allowed and not k.endswith("_token") and _plain(v)}


@lru_cache(maxsize=16)
def _template_variables(template: str | None) -> frozenset[str]:
    """The names a chat template reads from its context."""
    if not isinstance(template, str):
        return frozenset()
    try:
        return frozenset(meta.find_undeclared_variables(Environment().parse(template)))
    except TemplateError:
        return frozenset()


def _reserved(tokenizer: Any) -> frozenset[str]:
    names = set(inspect.signature(tokenizer.apply_chat_template).parameters)
    # NOTE: and what transformers puts in the template's context itself (functions included)
    names |= {"messages", "tools", "documents", "add_generation_prompt", "raise_exception", "strftime_now"}
    return frozenset(names | set(tokenizer.special_tokens_map))


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is JSON data, nested at most 8 deep."""
    if depth > 8:
        return False
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _protect_data(tokenizer: Any, value: Any, hidden: list[str], nonce: str) -> Any:
    """``value`` with every string in it protected as message text is (``_protect``)."""
    if isinstance(value, str):
        return _protect(tokenizer, value, hidden, nonce)
    if isinstance(value, list):
        return [_protect_data(tokenizer, v, hidden, nonce) for v in value]
    if isinstance(value, dict):
        return {k: _protect_data(tokenizer, v, hidden, nonce) for k, v in value.items()}
    return value


def supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders assistants' tool calls."""
    template = tokenizer.chat_template
    return isinstance(template, str) and "tool_calls" in template


def _protect(tokenizer: Any, content: Any, hidden: list[str], nonce: str) -> Any:
    """``content`` (a string or a list of text parts) with every special-token string replaced by
    a mark (recorded in ``hidden``)."""
    if isinstance(content, list):
        return [
            part | {"text": _protect(tokenizer, part["text"], hidden, nonce)}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    pattern = _specials(tokenizer)
    if not isinstance(content, str) or pattern is None:
        return content

    def mark(match: re.Match[str]) -> str:
        hidden.append(match.group(0))
        return f"{_OPEN}{nonce}{len(hidden) - 1}{_CLOSE}"

    return pattern.sub(mark, content)


def _specials(tokenizer: Any) -> re.Pattern[str] | None:
    return _special_pattern(tuple(sorted(special_strings(tokenizer), key=len, reverse=True)))


@lru_cache(maxsize=16)
def _special_pattern(strings: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(re.escape(s) for s in strings)) if strings else None


def special_strings(tokenizer: Any) -> set[str]:
    """Every string the tokenizer reads as one special token."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {t.content for t in added.values() if getattr(t, "special", False)} | set(
        tokenizer.all_special_tokens
    )
