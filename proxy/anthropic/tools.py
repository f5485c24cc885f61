"""Anthropic's tool fields (``tools``, ``tool_choice``) as kvproxy's ``ToolSet``, its structured
output's schema (``output_config.format``); the reply's ``tool_use`` blocks.

Source: Anthropic's API reference, Messages (tool use; ``output_config.format``, a ``json_schema``
with its ``schema``; the older ``output_format`` and both together refused, as the SDK refuses
them) and Prompt caching (tools come first in the cache order: tools, system, messages).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, cast

from proxy.anthropic.protocol import TTL_S
from proxy.http.errors import OpenAIError
from proxy.tools.grammars import closed
from proxy.tools.limits import SchemaBudget, check_tool_count
from proxy.tools.spec import NOT_JSON, Mode, ToolCall, ToolSet, dumps, json_value, make_tool, tool_set

CHOICES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
"""Anthropic's ``tool_choice.type`` as a ``ToolSet`` mode."""


def message_tools(tools: Any, choice: Any) -> tuple[ToolSet | None, list[str]]:
    """A Messages request's tools and tool choice (None without tools), and a warning for each
    tool left out of the prompt: Anthropic's server tools (``web_search_*``, ``code_execution_*``,
    ...) and its schema-less client tools (``bash_*``, ``text_editor_*``, ...), any ``type``
    other than ``custom``, which this server can neither run nor describe to its model. NOTE:
    left out, not refused, as a gateway in front of another model does: an agent that offers
    them by default (Claude Code's web search) works with the tools it has.

    Raises:
        OpenAIError: 400 naming the field: a tool that is not an object, a bad definition, a tool
            choice that is not ``auto``/``any``/``tool``/``none`` (or names a tool left out),
            more tools or larger schemas than ``proxy.tools.limits`` allows.
    """
    if tools is not None and not isinstance(tools, list):
        raise OpenAIError(400, "`tools` is a list", param="tools")
    check_tool_count(tools)
    defined, left_out, unrun, budget = [], [], [], SchemaBudget()
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise OpenAIError(400, "a tool is an object", param=f"tools[{i}]")
        if (kind := tool.get("type", "custom")) != "custom":
            left_out.append(f"tools[{i}] ({kind!s:.64}): a server or Anthropic-defined tool, left out")
            unrun.append(str(tool.get("name", kind)))
            continue
        param = f"tools[{i}]"
        fields = (tool.get("name"), tool.get("description"), tool.get("input_schema"))
        defined.append(make_tool(*fields, param, "input_schema", budget, tool.get("strict")))
    choice = choice or {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in CHOICES:
        raise OpenAIError(400, "tool_choice.type is one of auto, any, tool, none", param="tool_choice.type")
    if not defined and choice["type"] in ("auto", "none"):
        return None, left_out
    parallel = False if choice.get("disable_parallel_tool_use") else None
    mode = cast(Mode, CHOICES[choice["type"]])
    return tool_set(defined, mode, choice.get("name"), parallel, "tool_choice", unrun), left_out


def output_schema(output_config: Any, output_format: Any) -> dict[str, Any] | None:
    """The JSON Schema a Messages answer follows (Anthropic's structured outputs:
    ``output_config.format``, or the older top-level ``output_format``), closed as the hosted API
    requires (``proxy.tools.grammars.closed``); None: free text.

    Raises:
        OpenAIError: 400 naming the field: both given, a format that is not ``{"type":
            "json_schema", "schema": {...}}``, a schema over the limits (``proxy.tools.limits``).
    """
    inner = output_config.get("format") if isinstance(output_config, dict) else None
    if inner is not None and output_format is not None:
        reason = "Both output_format and output_config.format were provided; send only output_config.format"
        raise OpenAIError(400, reason, param="output_format")
    form, param = (inner, "output_config.format") if inner is not None else (output_format, "output_format")
    if form is None:
        return None
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        raise OpenAIError(400, f"{param}.type: Input should be 'json_schema'", param=f"{param}.type")
    schema = form.get("schema")
    if not isinstance(schema, dict):
        raise OpenAIError(400, f"{param}.schema: a JSON Schema object is required", param=f"{param}.schema")
    SchemaBudget().check(schema, f"{param}.schema")
    return closed(schema)


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


def echoed_arguments(arguments: str) -> str:
    """A call's arguments as Claude's history sends them back: the ``tool_use`` block's
    ``input`` (``content``) serialized as ``proxy.anthropic.turns`` serializes a history's."""
    return dumps(_input(arguments) or {})


def _input(arguments: str) -> Any:
    """A call's arguments as ``input``: an object, or ``{}`` for one cut short (``max_tokens``)."""
    value = json_value(arguments)
    return {} if value is NOT_JSON else value


def tool_use(call_id: str, name: str, arguments: Any) -> ToolUseBlock:
    """A ``tool_use`` block (``arguments``: its ``input``, a JSON object)."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
