"""Anthropic's tool fields (``tools``, ``tool_choice``) as kvproxy's ``ToolSet``; the reply's
``tool_use`` blocks.

Source: Anthropic's API reference, Messages (tool use) and Prompt caching (tools come first in
the cache order: tools, system, messages).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, cast

from proxy.anthropic.protocol import TTL_S
from proxy.http.errors import OpenAIError
from proxy.tools.limits import SchemaBudget, check_tool_count
from proxy.tools.spec import NOT_JSON, Mode, ToolCall, ToolSet, json_value, make_tool, tool_set

CHOICES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
"""Anthropic's ``tool_choice.type`` as a ``ToolSet`` mode."""


def message_tools(tools: Any, choice: Any) -> ToolSet | None:
    """A Messages request's tools and tool choice (None without tools).

    Raises:
        OpenAIError: 400 naming the field: a server tool (``type`` other than ``custom``), a bad
            definition, a tool choice that is not ``auto``/``any``/``tool``/``none``, more tools or
            larger schemas than ``proxy.tools.limits`` allows.
    """
    if tools is not None and not isinstance(tools, list):
        raise OpenAIError(400, "`tools` is a list", param="tools")
    check_tool_count(tools)
    defined, budget = [], SchemaBudget()
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise OpenAIError(
                400, f"tools of type `{kind}` are not supported; send custom tools", param=f"tools[{i}].type"
            )
        param = f"tools[{i}]"
        fields = (tool.get("name"), tool.get("description"), tool.get("input_schema"))
        defined.append(make_tool(*fields, param, "input_schema", budget, tool.get("strict")))
    choice = choice or {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in CHOICES:
        raise OpenAIError(400, "tool_choice.type is one of auto, any, tool, none", param="tool_choice.type")
    if not defined and choice["type"] in ("auto", "none"):
        return None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    mode = cast(Mode, CHOICES[choice["type"]])
    return tool_set(defined, mode, choice.get("name"), parallel, "tool_choice")


def tool_breakpoints(tools: Any) -> list[int]:
    """The TTLs (seconds) of the ``cache_control`` breakpoints on tool definitions."""
    marks = [t.get("cache_control") for t in tools or [] if isinstance(t, dict)]
    return [TTL_S[m.get("ttl", "5m")] for m in marks if isinstance(m, dict) and m.get("ttl", "5m") in TTL_S]


class TextBlock(TypedDict):
    """A reply's ``text`` content block."""

    type: Literal["text"]
    text: str


class ToolUseBlock(TypedDict):
    """A reply's ``tool_use`` content block: a call, its arguments as ``input``."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: Any


ReplyBlock = TextBlock | ToolUseBlock
"""A content block of a reply."""


def content(text: str, calls: list[ToolCall]) -> list[ReplyBlock]:
    """A reply's content blocks: its text (when there is any, or nothing else), then a
    ``tool_use`` block per call."""
    blocks: list[ReplyBlock] = [TextBlock(type="text", text=text)] if text or not calls else []
    return blocks + [tool_use(call.id, call.name, _input(call.arguments)) for call in calls]


def _input(arguments: str) -> Any:
    """A call's arguments as ``input``: an object, or ``{}`` for one cut short (``max_tokens``)."""
    value = json_value(arguments)
    return {} if value is NOT_JSON else value


def tool_use(call_id: str, name: str, arguments: Any) -> ToolUseBlock:
    """A ``tool_use`` block (``arguments``: its ``input``, a JSON object)."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
