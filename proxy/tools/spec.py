"""Tools as kvproxy holds them, whatever the dialect: the tool list, the tool choice, the calls.

OpenAI's ``tools``/``tool_choice``/``parallel_tool_calls`` and Anthropic's ``tools``/
``tool_choice`` both become a ``ToolSet``. Tool definitions are made canonical (every object's
keys sorted, recursively), so the same tools sent in another key order or formatting render to
the same prompt tokens and an agent's prefix stays cached.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from proxy.http.errors import OpenAIError
from proxy.tools.limits import SchemaBudget, nested_within

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A function name, as OpenAI's reference defines it (Anthropic's is the same set)."""

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

Mode = Literal["auto", "none", "required", "named"]


def canonical(value: Any) -> Any:
    """``value`` with every object's keys in sorted order (lists keep theirs)."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """JSON as the grammars write it and the prompts show it: ``", "`` and ``": "`` separators,
    non-ASCII characters as they are."""
    return json.dumps(value, ensure_ascii=False)


NOT_JSON: Any = object()
"""What ``json_value`` gives for text that is not JSON (or for no text at all)."""


def json_value(text: Any) -> Any:
    """``text`` parsed as JSON when it is a string holding JSON nested at most
    ``proxy.tools.limits.MAX_SCHEMA_DEPTH`` levels deep, else ``NOT_JSON``.

    NOTE: tool calls' arguments come back in later requests' histories, where templates and
    ``canonical`` walk them recursively: deeper values are refused here, never a RecursionError."""
    if not isinstance(text, str):
        return NOT_JSON
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return NOT_JSON
    return value if nested_within(value) else NOT_JSON


class OpenAIToolFunction(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]
    """A JSON Schema."""


class OpenAITool(TypedDict):
    """A function tool's definition in OpenAI's shape, as chat templates take it (``tools``)."""

    type: Literal["function"]
    function: OpenAIToolFunction


class OpenAIFunction(TypedDict):
    name: str
    arguments: str


class OpenAICall(TypedDict):
    """A call in OpenAI's shape (``tool_calls[]`` of a reply, and of a chat template's message)."""

    id: str
    type: Literal["function"]
    function: OpenAIFunction


@dataclass(frozen=True)
class Tool:
    """One function tool: its name, description and JSON Schema of arguments (canonical), and
    whether it is ``strict`` (OpenAI's ``function.strict``, Anthropic's ``strict``): a strict
    tool's schema is enforced in full or refused; another's keywords the grammar cannot enforce
    are left out of it, with a warning (``proxy.tools.grammars.options``)."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False

    def as_openai(self) -> OpenAITool:
        """The definition as chat templates take it (OpenAI's shape), keys sorted."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return canonical({"type": "function", "function": function})


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: an id, the tool's name, and its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> OpenAICall:
        """The call as OpenAI's ``tool_calls[]`` writes it."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Piece = Text | CallStart | Arguments
"""What a streamed answer says next: text, a call's start (id, name), or its arguments' JSON."""


def call_id(prefix: str = "call_") -> str:
    """A new call id: ``call_...`` (OpenAI's style) or ``toolu_...`` (Anthropic's)."""
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolSet:
    """A request's tools and how it lets the model use them.

    Attributes:
        tools: the definitions, in the request's order.
        mode: ``auto`` (the model chooses), ``none`` (no call), ``required`` (at least one call),
            ``named`` (a call of ``name``).
        name: the tool ``named`` requires.
        parallel: whether one answer may hold several calls; None when the request does not say
            (the format decides: ``proxy.tools.formats``).
        allowed: the names of the tools the answer may call (OpenAI's ``allowed_tools`` choice);
            None: all. Every tool is still written into the prompt, so a conversation that
            narrows its tools turn by turn keeps its cached prefix.
    """

    tools: tuple[Tool, ...]
    mode: Mode = "auto"
    name: str | None = None
    parallel: bool | None = None
    allowed: frozenset[str] | None = None

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools the answer may call."""
        if self.mode == "none":
            return ()
        named = [t for t in self.tools if self.mode != "named" or t.name == self.name]
        return tuple(t for t in named if self.allowed is None or t.name in self.allowed)


def make_tool(
    name: Any,
    description: Any,
    parameters: Any,
    param: str,
    schema_field: str = "parameters",
    budget: SchemaBudget | None = None,
    strict: Any = None,
) -> Tool:
    """A ``Tool`` from a definition's fields; ``param`` is where it is in the body, and
    ``schema_field`` the name of its schema there (Anthropic's is ``input_schema``). ``budget``
    is what the request's tools share (``proxy.tools.limits``; None: this tool's own).
    ``strict``: the definition's ``strict`` (a boolean, or None when not given: not strict).

    Raises:
        OpenAIError: 400 naming the field: a bad name, parameters that are not an object, a
            ``strict`` that is not a boolean, or a schema over the limits (checked before
            anything else walks it).
    """
    if not isinstance(name, str) or not NAME.match(name):
        raise OpenAIError(400, "a tool name is 1-64 letters, digits, '_' or '-'", param=f"{param}.name")
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        reason = 'a tool\'s parameters are a JSON Schema of an object ("type": "object")'
        raise OpenAIError(400, reason, param=f"{param}.{schema_field}")
    (budget or SchemaBudget()).check(parameters, f"{param}.{schema_field}")
    if description is not None and not isinstance(description, str):
        raise OpenAIError(400, "a tool's description is a string", param=f"{param}.description")
    if strict is not None and not isinstance(strict, bool):
        raise OpenAIError(400, "a tool's `strict` is a boolean", param=f"{param}.strict")
    return Tool(name, description or "", canonical(parameters), bool(strict))


def tool_set(
    tools: list[Tool],
    mode: Mode,
    name: str | None,
    parallel: bool | None,
    param: str,
    left_out: Sequence[str] = (),
    allowed: Sequence[str] | None = None,
) -> ToolSet:
    """Check names are distinct and a named choice names one of them. ``left_out``: the names
    of the request's tools the dialect left out of the prompt (tools this server cannot run),
    said in the refusal of a choice that needs one of them. ``allowed``: the tools an
    ``allowed_tools`` choice lets the answer call (each must be in ``tools``; None: all).

    Raises:
        OpenAIError: 400 naming ``param`` (the tool choice) or the repeated tool.
    """
    names: set[str] = set()
    for tool in tools:  # NOTE: a set, not list.count: linear in the number of tools
        if tool.name in names:
            raise OpenAIError(400, f"tool `{tool.name}` is defined twice", param="tools")
        names.add(tool.name)
    if mode == "named" and name not in names and name in left_out:
        reason = f"tool choice names `{name!s:.64}`, a tool this server cannot run (left out of the prompt)"
        raise OpenAIError(400, reason, param=param)
    if mode in ("required", "named") and not tools:
        but = " this server can run (the tools sent are left out of the prompt)" if left_out else ""
        raise OpenAIError(400, f"a tool choice that calls a tool needs `tools`{but}", param=param)
    if mode == "named" and name not in names:
        raise OpenAIError(400, f"tool choice names `{name}`, which is not in `tools`", param=param)
    if allowed is not None:
        if (unknown := next((n for n in allowed if n not in names), None)) is not None:
            raise OpenAIError(
                400, f"allowed tools name `{unknown!s:.64}`, which is not in `tools`", param=param
            )
        if mode == "required" and not allowed:
            raise OpenAIError(400, "a tool choice that calls a tool needs an allowed tool", param=param)
        return ToolSet(tuple(tools), mode, name, parallel, frozenset(allowed))
    return ToolSet(tuple(tools), mode, name, parallel)
