"""OpenAI's tool fields (``tools``, ``tool_choice``, ``parallel_tool_calls``) and
``response_format`` as kvproxy's ``ToolSet`` and JSON Schema; the reply's ``tool_calls``.

Source: the OpenAI API reference, Chat Completions (function tools; structured outputs).
"""

from __future__ import annotations

from typing import Any, cast

from proxy.http.errors import OpenAIError
from proxy.openai.protocol import ChatCompletionRequest, ChatMessage
from proxy.openai.replies import CallDelta, ChunkDelta
from proxy.tools import grammars
from proxy.tools.limits import SchemaBudget, check_tool_count
from proxy.tools.spec import (
    NAME,
    Arguments,
    CallStart,
    Mode,
    Piece,
    Tool,
    ToolSet,
    make_tool,
    tool_set,
)

ANY_OBJECT: dict[str, Any] = {"type": "object"}


def chat_tools(body: ChatCompletionRequest) -> ToolSet | None:
    """The request's tools and tool choice (None without tools): ``auto``, ``none``,
    ``required``, a named function, or ``allowed_tools`` (``auto`` or ``required`` among the
    functions it lists; every tool is still in the prompt).

    Raises:
        OpenAIError: 400 naming the field: a tool that is not a function, a bad definition, a
            tool choice of another shape, an allowed tool not in ``tools``.
    """
    tools = function_tools(body.tools)
    choice, name = body.tool_choice or "auto", None
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        mode, allowed = allowed_tools(choice.get("allowed_tools"))
        return tool_set(tools, mode, None, body.parallel_tool_calls, "tool_choice", allowed=allowed)
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict):
            raise OpenAIError(
                400, "a named tool choice is {type: function, function: {name}}", param="tool_choice"
            )
        choice, name = "named", function.get("name")
    if choice not in ("auto", "none", "required", "named"):
        raise OpenAIError(
            400, f"tool_choice `{choice}` is not one of auto, none, required", param="tool_choice"
        )
    if not tools and choice in ("auto", "none"):
        return None
    return tool_set(tools, cast(Mode, choice), name, body.parallel_tool_calls, "tool_choice")


def allowed_tools(spec: Any) -> tuple[Mode, list[str]]:
    """Chat's ``tool_choice.allowed_tools`` (``{mode: auto | required, tools: [{type: function,
    function: {name}}]}``, the OpenAI API reference) as a mode and the functions' names.

    Raises:
        OpenAIError: 400 naming ``tool_choice`` for another shape.
    """
    tools = spec.get("tools") if isinstance(spec, dict) else None
    mode = spec.get("mode") if isinstance(spec, dict) else None
    names = [
        t["function"].get("name")
        for t in tools or ()
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
    ]
    if mode not in ("auto", "required") or not isinstance(tools, list) or len(names) != len(tools):
        reason = "allowed_tools is {mode: auto | required, tools: [{type: function, function: {name}}]}"
        raise OpenAIError(400, reason, param="tool_choice")
    return cast(Mode, mode), [str(n) for n in names]


def function_tools(definitions: list[Any] | None) -> list[Tool]:
    """OpenAI's ``tools`` list as ``Tool``s.

    Raises:
        OpenAIError: 400 naming ``tools[i]...``: a tool that is not a function, a bad definition,
            more tools or larger schemas than ``proxy.tools.limits`` allows.
    """
    check_tool_count(definitions)
    tools, budget = [], SchemaBudget()
    for i, tool in enumerate(definitions or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise OpenAIError(
                400,
                f"tools of type `{kind}` are not supported; send function tools",
                param=f"tools[{i}].type",
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise OpenAIError(400, "a function tool has a `function` object", param=f"tools[{i}].function")
        param = f"tools[{i}].function"
        fields = (function.get("name"), function.get("description"), function.get("parameters"))
        tools.append(make_tool(*fields, param, budget=budget, strict=function.get("strict")))
    return tools


def check_history(messages: list[ChatMessage]) -> None:
    """The history's calls and results are well formed: each call a function with a name and
    arguments as a string (as OpenAI sends them: JSON, or a call cut short as the client got it,
    rendered as its text, as is JSON nested past ``MAX_SCHEMA_DEPTH``); each ``tool`` message
    the answer to a call made before it, or, without a ``tool_call_id``, a result naming its
    tool (``name``: the Responses API's result of no call, ``proxy.responses.history``)."""
    made: set[Any] = set()
    for i, message in enumerate(messages):
        for j, call in enumerate(message.tool_calls or []):
            param = f"messages[{i}].tool_calls[{j}].function"
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise OpenAIError(400, "a tool call is a function with a name", param=param)
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                reason = "a tool call's arguments are a string (JSON text)"
                raise OpenAIError(400, reason, param=f"{param}.arguments")
            made.add(call.get("id"))
        by_name = message.tool_call_id is None and bool(message.name)
        if message.role == "tool" and message.tool_call_id not in made and not by_name:
            reason = "a tool message answers a tool call made before it (its tool_call_id)"
            raise OpenAIError(400, reason, param=f"messages[{i}].tool_call_id")


def answer_schema(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON Schema ``response_format`` asks the answer to follow (None: free text).

    Raises:
        OpenAIError: 400 naming the field: another type, a ``json_schema`` without a schema, a
            schema over the limits (``proxy.tools.limits``).
    """
    form = body.response_format
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return ANY_OBJECT
    if form.type != "json_schema":
        raise OpenAIError(
            400,
            f"response_format `{form.type}` is not one of text, json_object, json_schema",
            param="response_format.type",
        )
    spec = form.json_schema
    if not isinstance(spec, dict):
        raise OpenAIError(
            400,
            "a json_schema response format has a `json_schema` object",
            param="response_format.json_schema",
        )
    if not isinstance(spec.get("name"), str) or not NAME.match(spec["name"]):
        reason = "json_schema.name is 1-64 letters, digits, '_' or '-'"
        raise OpenAIError(400, reason, param="response_format.json_schema.name")
    schema, param = spec.get("schema", ANY_OBJECT), "response_format.json_schema.schema"
    if not isinstance(schema, dict):
        raise OpenAIError(400, "json_schema.schema is a JSON Schema object", param=param)
    SchemaBudget().check(schema, param)
    return grammars.closed(schema) if spec.get("strict") else schema


def delta(piece: Piece) -> ChunkDelta:
    """One streamed piece of an answer as a chunk's ``delta``."""
    if isinstance(piece, CallStart):
        call: CallDelta = {
            "index": piece.index,
            "id": piece.id,
            "type": "function",
            "function": {"name": piece.name, "arguments": ""},
        }
        return {"tool_calls": [call]}
    if isinstance(piece, Arguments):
        return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}
    return {"content": piece.text}
