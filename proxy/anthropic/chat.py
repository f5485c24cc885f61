"""A Messages body read once as the chat the core runs: its template messages (OpenAI's shape),
its tools, its ``cache_control`` breakpoints and its prefill. ``/v1/messages`` starts it as a
turn; ``kvproxy route`` renders the same messages to find the replica that holds them, so this
module imports no engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.anthropic.caching import breakpoint_error
from proxy.anthropic.protocol import MessagesRequest
from proxy.anthropic.tools import message_tools, tool_breakpoints
from proxy.anthropic.turns import content_error, prefill
from proxy.http.errors import OpenAIError
from proxy.tools.spec import ToolSet


@dataclass(frozen=True)
class MessagesChat:
    """A Messages body as a chat.

    Attributes:
        messages: the chat template's messages, before any tool definitions go in
            (``MessagesRequest.template_messages``).
        tools: the body's tools and tool choice (None: none).
        marks: the ``cache_control`` breakpoints as ``(index of the message whose end they
            mark, or None for the end of the tool definitions; TTL in seconds)``.
        prefill: the final assistant turn's text, which the answer continues (None: none).
    """

    messages: list[dict[str, Any]]
    tools: ToolSet | None
    marks: tuple[tuple[int | None, int], ...]
    prefill: str | None


def check_body(body: MessagesRequest) -> None:
    """Refuse what the body asks that this server cannot honour, in Anthropic's words.

    Raises:
        OpenAIError: 400 naming the field: one not supported (``unsupported_parameter``), text
            Anthropic refuses (``proxy.anthropic.turns.content_error``), a broken caching rule
            (``proxy.anthropic.caching.breakpoint_error``).
    """
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")
    for broken in (content_error(body), breakpoint_error(body)):
        if broken is not None:
            raise OpenAIError(400, broken[1], param=broken[0])


def messages_chat(body: MessagesRequest) -> MessagesChat:
    """The body as a chat (``MessagesChat``). A breakpoint on a tool definition counts only when
    the body has tools to write (they come first in the prompt).

    Raises:
        OpenAIError: 400 naming a tool field that cannot be honoured
            (``proxy.anthropic.tools.message_tools``).
    """
    extra = body.model_extra or {}
    tools = message_tools(extra.get("tools"), extra.get("tool_choice"))
    messages, breakpoints = body.template_messages()
    marks: list[tuple[int | None, int]] = list(breakpoints)
    if tools is not None:
        marks += [(None, ttl) for ttl in tool_breakpoints(extra.get("tools"))]
    return MessagesChat(messages, tools, tuple(marks), prefill(body))
