"""A Messages body read once as the neutral turn the core runs (``proxy.serving.turn``): its
template messages (OpenAI's shape), tools, ``cache_control`` breakpoints as cache marks, prefill
and sampling. ``/v1/messages`` starts the turn; ``kvproxy route`` renders the same messages to
find the replica that holds them, so this module imports no engine.
"""

from __future__ import annotations

from proxy.anthropic.caching import breakpoint_error
from proxy.anthropic.content import content_error, prefill
from proxy.anthropic.protocol import MessagesRequest
from proxy.anthropic.tools import message_tools, tool_breakpoints
from proxy.http.errors import OpenAIError
from proxy.serving.turn import CacheMark, Params, Sampling, Turn

PARAMS = Params(prompt="messages", tools="tools[{i}].input_schema", schema="")
"""Where a Messages body's errors are named."""
CALL_PREFIX = "toolu_"
"""The prefix of the ids of the answer's ``tool_use`` blocks."""


def check_body(body: MessagesRequest) -> None:
    """Refuse what the body asks that this server cannot honour, in Anthropic's words.

    Raises:
        OpenAIError: 400 naming the field: one not supported (``unsupported_parameter``), text
            Anthropic refuses (``proxy.anthropic.content.content_error``), a broken caching rule
            (``proxy.anthropic.caching.breakpoint_error``).
    """
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")
    for broken in (content_error(body), breakpoint_error(body)):
        if broken is not None:
            raise OpenAIError(400, broken[1], param=broken[0])


def messages_turn(body: MessagesRequest, tenant: str) -> Turn:
    """The body as a turn: the template messages before any tool definitions go in
    (``MessagesRequest.template_messages``), the tools and tool choice, a cache mark per
    ``cache_control`` breakpoint (one on a tool definition counts only when there are tools to
    write: they come first in the prompt), the prefill, ``temperature``, ``top_p``,
    ``max_tokens`` (None for ``count_tokens``) and ``stop_sequences``.

    Raises:
        OpenAIError: 400 naming a tool field that cannot be honoured
            (``proxy.anthropic.tools.message_tools``).
    """
    extra = body.model_extra or {}
    tools = message_tools(extra.get("tools"), extra.get("tool_choice"))
    messages, breakpoints = body.template_messages()
    marks = [CacheMark(index, ttl) for index, ttl in breakpoints]
    if tools is not None:
        marks += [CacheMark(None, ttl) for ttl in tool_breakpoints(extra.get("tools"))]
    return Turn(
        body.model,
        tenant,
        messages=messages,
        tools=tools,
        sampling=Sampling(temperature=body.temperature, top_p=body.top_p),
        max_tokens=body.max_tokens,
        stop=tuple(body.stop_sequences or ()),
        marks=tuple(marks),
        prefill=prefill(body),
        params=PARAMS,
        call_prefix=CALL_PREFIX,
    )
