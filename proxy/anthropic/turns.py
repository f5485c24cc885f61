"""A Messages body read once as the neutral turn the core runs (``proxy.serving.turn``): its
template messages (OpenAI's shape), tools, ``cache_control`` breakpoints as cache marks, prefill
and sampling. ``/v1/messages`` starts the turn; ``kvproxy route`` renders the same messages to
find the replica that holds them, so this module imports no engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from proxy.anthropic.caching import breakpoint_error
from proxy.anthropic.content import content_error, prefill
from proxy.anthropic.protocol import TTL_S, ContentBlock, Message, MessagesRequest
from proxy.anthropic.thinking import reasoning_error
from proxy.anthropic.tools import echoed_arguments, message_tools, output_schema, tool_breakpoints
from proxy.http.errors import OpenAIError
from proxy.serving.metadata import LeftOut, leave_out
from proxy.serving.turn import CacheMark, Params, Sampling, Turn
from proxy.tools.rendering import REJECTED, TemplateMessage
from proxy.tools.spec import dumps

PARAMS = Params(prompt="messages", tools="tools[{i}].input_schema", schema="output_config.format.schema")
"""Where a Messages body's errors are named."""
OUTPUT_FORMAT_PARAMS = Params(
    prompt="messages", tools="tools[{i}].input_schema", schema="output_format.schema"
)
"""... in a body with the older top-level ``output_format``."""
CALL_PREFIX = "toolu_"
"""The prefix of the ids of the answer's ``tool_use`` blocks."""


def check_body(body: MessagesRequest) -> None:
    """Refuse what the body asks that this server cannot honour, in Anthropic's words.

    Raises:
        OpenAIError: 400 naming the field: one not supported (``unsupported_parameter``), text
            Anthropic refuses (``proxy.anthropic.content.content_error``), a broken caching rule
            (``proxy.anthropic.caching.breakpoint_error``), reasoning settings of a wrong shape
            (``proxy.anthropic.thinking.reasoning_error``; of the right shape they are satisfied
            by an answer without thinking).
    """
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")
    extra = body.model_extra or {}
    reasoning = reasoning_error(extra.get("thinking"), extra.get("output_config"), body.max_tokens)
    for broken in (reasoning, content_error(body), breakpoint_error(body)):
        if broken is not None:
            raise OpenAIError(400, broken[1], param=broken[0])


def messages_turn(body: MessagesRequest, tenant: str, keep_metadata: bool = False) -> Turn:
    """The body as a turn: the template messages before any tool definitions go in
    (``template_messages``; known client metadata left out of the system blocks unless
    ``keep_metadata``: ``without_metadata``), the tools and tool choice or the answer's schema
    (``output_config.format``: ``proxy.anthropic.tools.output_schema``), a cache mark per
    ``cache_control`` breakpoint (one on a tool definition counts only when there are tools to
    write: they come first in the prompt), the prefill, ``temperature``, ``top_p``,
    ``max_tokens`` (None for ``count_tokens``) and ``stop_sequences``.

    Raises:
        OpenAIError: 400 naming a tool or format field that cannot be honoured
            (``proxy.anthropic.tools.message_tools``, ``output_schema``); a format with tools or
            with a prefill.
    """
    body, left_out = (body, ()) if keep_metadata else without_metadata(body)
    extra = body.model_extra or {}
    tools, left_out_tools = message_tools(extra.get("tools"), extra.get("tool_choice"))
    schema = output_schema(extra.get("output_config"), extra.get("output_format"))
    if schema is not None and tools is not None:
        reason = (
            "output_config.format together with tools is not supported by this server; send one or the other"
        )
        raise OpenAIError(400, reason, param="output_config.format", code="unsupported_parameter")
    filled = prefill(body)
    if schema is not None and filled is not None:
        reason = (
            "output_config.format cannot continue a prefilled assistant turn: its answer is one JSON value"
        )
        raise OpenAIError(400, reason, param="output_config.format")
    messages, breakpoints = template_messages(body)
    marks = [CacheMark(index, ttl) for index, ttl in breakpoints]
    if tools is not None:
        marks += [CacheMark(None, ttl) for ttl in tool_breakpoints(extra.get("tools"))]
    return Turn(
        body.model,
        tenant,
        messages=messages,
        tools=tools,
        schema=schema,
        sampling=Sampling(temperature=body.temperature, top_p=body.top_p),
        max_tokens=body.max_tokens,
        stop=tuple(body.stop_sequences or ()),
        marks=tuple(marks),
        prefill=filled,
        params=PARAMS if extra.get("output_format") is None else OUTPUT_FORMAT_PARAMS,
        call_prefix=CALL_PREFIX,
        echo_arguments=echoed_arguments,
        left_out=left_out,
        warnings=tuple(left_out_tools),
    )


def without_metadata(body: MessagesRequest) -> tuple[MessagesRequest, tuple[LeftOut, ...]]:
    """The body with the client metadata at the start of each ``system`` block (or of a
    ``system`` string), and of each ``system`` message inside ``messages``, left out
    (``proxy.serving.metadata``), and what was left out. A block keeps its ``cache_control`` mark
    (its text may become empty); a system prompt or message that held nothing else, and no mark,
    is left out whole, as if the body had none (unless no message would be left)."""
    update: dict[str, object] = {}
    left_out: list[LeftOut] = []
    if body.system is not None:
        system, left = _system_without_metadata(body.system, "system")
        if left:
            update["system"], left_out = system, left
    messages: list[Message] = []
    in_messages: list[LeftOut] = []
    for i, message in enumerate(body.messages):
        if message.role != "system":
            messages.append(message)
            continue
        content, left = _system_without_metadata(message.content, f"messages[{i}].content")
        in_messages += left
        if content is not None:
            messages.append(message.model_copy(update={"content": content}) if left else message)
    # NOTE: never every message: a conversation of metadata alone is rendered as sent
    if in_messages and messages:
        update["messages"], left_out = messages, left_out + in_messages
    return (body.model_copy(update=update), tuple(left_out)) if left_out else (body, ())


def _system_without_metadata(
    system: str | list[ContentBlock], param: str
) -> tuple[str | list[ContentBlock] | None, list[LeftOut]]:
    """A system text (a string, or blocks named ``param[i]``) without its client metadata, None
    when nothing is left of it (no text, no mark), and what was left out."""
    if isinstance(system, str):
        text, left = leave_out(system, param)
        return text or None, left
    blocks, left_out = [], []
    for i, block in enumerate(system):
        text, left = leave_out(block.text or "", f"{param}[{i}]") if block.type == "text" else ("", [])
        blocks.append(block.model_copy(update={"text": text}) if left else block)
        left_out += left
    if left_out and not any(b.text or b.cache_control or b.type != "text" for b in blocks):
        return None, left_out
    return blocks, left_out


def system_role_refused(body: MessagesRequest, error: OpenAIError) -> OpenAIError | None:
    """When ``error`` is the chat template refusing a body that holds a ``system`` message inside
    ``messages``: the hosted API's own refusal of that role (``Unexpected role "system"``
    ... ``input message role``), the words agents recover on: Claude Code then sends the
    instruction as user text. None for any other error.

    NOTE: a template may allow system messages only first (the server cannot place one where it
    stands then); the hosted API answers models without the feature this way."""
    inside = any(message.role == "system" for message in body.messages)
    if not inside or error.status != 400 or not error.message.startswith(REJECTED):
        return None
    reason = (
        'messages: Unexpected role "system": this model\'s chat template cannot place a system '
        f"message inside the conversation ({error.message}). Send instructions in the top-level "
        '`system` parameter, not "system" as an input message role.'
    )
    return OpenAIError(400, reason, param="messages")


def template_messages(body: MessagesRequest) -> tuple[list[TemplateMessage], list[tuple[int, int]]]:
    """A Messages body's system prompt and messages as chat templates take them (OpenAI's shape:
    an assistant's ``tool_use`` blocks as ``tool_calls``, each ``tool_result`` as a ``tool``
    message before the user's text, a ``system`` message as a system message where it stands, an
    assistant's thinking blocks left out), and the ``cache_control`` breakpoints as ``(index of
    the template message that holds it, TTL in seconds)``.

    NOTE: a mid-conversation system message is rendered at its place, never moved into the
    system prompt: the prompt up to it stays the prefix the earlier turns stored, and the chat
    template decides how a system message there looks (one that cannot render it is a 400)."""
    messages: list[TemplateMessage] = []
    breakpoints: list[tuple[int, int]] = []
    if body.system is not None:
        system = (
            [ContentBlock(type="text", text=body.system)] if isinstance(body.system, str) else body.system
        )
        messages.append({"role": "system", "content": "".join(b.text or "" for b in system)})
        breakpoints += [(0, TTL_S[b.cache_control.ttl]) for b in system if b.cache_control]
    turns = body.turns()
    for message in turns:
        blocks = message.blocks()
        if message is turns[-1] and message.role == "assistant" and not _rendered(message):
            break  # NOTE: an empty final assistant turn is no prefill: the answer is a new turn
        for block in blocks:
            if block.type == "tool_result":
                extra = block.model_extra or {}
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": extra.get("tool_use_id"),
                        "content": result_text(extra),
                    }
                )
        text = "".join(b.text or "" for b in blocks if b.type == "text")
        calls = [_tool_call(b.model_extra or {}) for b in blocks if b.type == "tool_use"]
        if text or calls or not any(b.type == "tool_result" for b in blocks):
            turn: TemplateMessage = {"role": message.role, "content": text}
            messages.append(turn | ({"tool_calls": calls} if calls else {}))
        breakpoints += [(len(messages) - 1, TTL_S[b.cache_control.ttl]) for b in blocks if b.cache_control]
    if body.cache_control is not None:  # NOTE: automatic caching marks the end of the last message
        breakpoints.append((len(messages) - 1, TTL_S[body.cache_control.ttl]))
    return messages, breakpoints


def _rendered(message: Message) -> bool:
    """Whether an assistant turn renders anything (empty content and thinking blocks do not)."""
    return bool(message.content) and any(b.type in ("text", "tool_use") for b in message.blocks())


def result_text(block: Mapping[str, Any]) -> str:
    """A ``tool_result``'s content as text (a string, or its text blocks joined); an error's
    content is marked as one."""
    content = block.get("content") or ""
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return f"Error: {content}" if block.get("is_error") else str(content)


class CalledFunction(TypedDict):
    """A template tool call's ``function``: the tool's name and its arguments as JSON text."""

    name: str | None
    arguments: str


class ToolCallEntry(TypedDict):
    """A template message's ``tool_calls`` entry (OpenAI's shape)."""

    id: str | None
    type: Literal["function"]
    function: CalledFunction


def _tool_call(block: Mapping[str, Any]) -> ToolCallEntry:
    """A ``tool_use`` block as a template message's ``tool_calls`` entry (OpenAI's shape)."""
    arguments = dumps(block.get("input") or {})
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }
