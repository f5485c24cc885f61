"""A Responses request's ``tools`` as the chat's function tools: function tools as they are,
namespaces flattened into their functions, and the tools kvproxy cannot run left out.

- ``{"type": "namespace", "name": ns, "tools": [...]}`` (Codex's multi-agent tools): each
  function inside is offered to the model as ``ns__name`` (``flat_name``); a call the model makes
  is reported back as OpenAI reports it, ``name`` the function's own with ``namespace`` beside it
  (``ToolPlan.call_name``), and a ``function_call`` item sent back with its ``namespace`` renders
  under the same flat name, so the history reads as the model wrote it.
- Hosted tools the server would run itself (``web_search``, ``file_search``, ``code_interpreter``,
  ``image_generation``, ``computer_use_preview``, ``mcp``, ``local_shell``, ``shell``,
  ``apply_patch``, ``tool_search``, ...) and ``custom`` (free-form) tools are not offered to the
  model: the answer goes on without them, and the response names them in ``x-kvproxy-warning``
  (``proxy.http.warnings``).

Source: the OpenAI API reference, Responses (tools: function, namespace, custom and the hosted
tools; the ``function_call`` item's ``namespace``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.http.errors import OpenAIError
from proxy.http.warnings import WARNING_HEADER, warning_headers

NAMESPACE_SEPARATOR = "__"
"""Between a namespace and a function's name in the name the model sees (``a-z0-9_-`` only, as
a function's name is)."""

MAX_NAMED = 8
"""The most kinds of tool a warning names (``ToolPlan.warning``)."""


def flat_name(name: str, namespace: str | None) -> str:
    """The name the model sees for ``name`` in ``namespace`` (``name`` itself outside one)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


@dataclass
class ToolPlan:
    """What the model is offered of a request's ``tools``.

    Attributes:
        chat: the chat's function tools (``{type: function, function: {...}}``), in order.
        origins: where each of ``chat`` comes from in the request (``tools[3]``,
            ``tools[1].tools[0]``), to name it in an error.
        namespaced: flat name -> (name, namespace) of each function offered from a namespace.
        left_out: the types of the tools not offered (each once, in order).
    """

    chat: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)

    def call_name(self, name: str) -> tuple[str, str | None]:
        """A call's flat name as OpenAI reports it: (name, namespace or None)."""
        return self.namespaced.get(name, (name, None))

    def warning(self) -> str | None:
        """``WARNING_HEADER``'s value (None when every tool was offered)."""
        if not self.left_out:
            return None
        # NOTE: the kinds are the request's text: a few, each cut short, and a count of the rest
        shown = ", ".join(kind[:64] for kind in self.left_out[:MAX_NAMED])
        more = f" and {len(self.left_out) - MAX_NAMED} more" if len(self.left_out) > MAX_NAMED else ""
        return f"tools left out, this server cannot run them: {shown}{more}"

    def param(self, param: str | None) -> str | None:
        """A chat error's ``tools[k]...`` as the request names that tool."""
        if param is None or not param.startswith("tools["):
            return param
        index, _, rest = param[len("tools[") :].partition("]")
        if not index.isdigit() or int(index) >= len(self.origins):
            return param
        return self.origins[int(index)] + rest.replace(".function.", ".", 1).removeprefix(".function")

    def _offer(self, tool: dict[str, Any], origin: str, namespace: str | None = None) -> None:
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        if namespace is not None and isinstance(tool.get("name"), str):
            function["name"] = flat_name(tool["name"], namespace)
            self.namespaced[function["name"]] = (tool["name"], namespace)
        self.chat.append({"type": "function", "function": function})
        self.origins.append(origin)

    def _leave_out(self, kind: str) -> None:
        if kind not in self.left_out:
            self.left_out.append(kind)


def tool_plan(tools: list[Any] | None) -> ToolPlan:
    """``tools`` as the model is offered them (see the module docstring).

    Raises:
        OpenAIError: 400 naming ``tools[i]``: a tool that is not an object with a string
            ``type``, a namespace without a string ``name`` or a ``tools`` list.
    """
    plan = ToolPlan()
    for i, tool in enumerate(tools or []):
        kind = _kind(tool, f"tools[{i}]")
        if kind == "function":
            plan._offer(tool, f"tools[{i}]")
        elif kind == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not namespace:
                raise OpenAIError(400, "a namespace has a string `name`", param=f"tools[{i}].name")
            if not isinstance(inner, list):
                raise OpenAIError(400, "a namespace has a `tools` list", param=f"tools[{i}].tools")
            for j, member in enumerate(inner):
                if (member_kind := _kind(member, f"tools[{i}].tools[{j}]")) == "function":
                    plan._offer(member, f"tools[{i}].tools[{j}]", namespace)
                else:
                    plan._leave_out(member_kind)
        else:
            plan._leave_out(kind)
    return plan


def _kind(tool: object, param: str) -> str:
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
        raise OpenAIError(400, "a tool is an object with a string `type`", param=f"{param}.type")
    kind: str = tool["type"]
    return kind


def echoed_tool(tool: object) -> object:
    """A tool as a stored response echoes it: a function's own fields (name, description,
    parameters, strictness), a namespace's name, description and functions, a hosted tool's
    type and name only (the model reads nothing else of them)."""
    if not isinstance(tool, dict):
        return tool
    if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
        keep = {k: tool[k] for k in ("type", "name", "description") if k in tool}
        return keep | {"tools": [echoed_tool(t) for t in tool["tools"]]}
    if tool.get("type") == "function":
        return {k: tool[k] for k in ("type", "name", "description", "parameters", "strict") if k in tool}
    return {k: tool[k] for k in ("type", "name") if k in tool}


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """``auto``, ``none``, ``required``, ``{type: function, name[, namespace]}`` or
    ``{type: allowed_tools, mode, tools}`` as chat's tool choice (a namespaced function by its
    flat name; the hosted tools an ``allowed_tools`` lists are left out, as ``tool_plan`` leaves
    them out of the prompt).

    Raises:
        OpenAIError: 400 for another kind of choice: a hosted tool's (it is left out, see
            ``tool_plan``).
    """
    if isinstance(choice, str):
        return choice
    kind, namespace = choice.get("type"), choice.get("namespace")
    if kind == "allowed_tools":
        return {"type": "allowed_tools", "allowed_tools": _allowed_functions(choice)}
    if isinstance(kind, str) and kind != "function":
        reason = f"tool_choice names a tool of type `{kind:.64}`, which this server cannot run (left out)"
        raise OpenAIError(400, reason, param="tool_choice")
    if kind == "function" and isinstance(choice.get("name"), str) and isinstance(namespace, str | None):
        return {"type": "function", "function": {"name": flat_name(choice["name"], namespace)}}
    raise OpenAIError(
        400,
        "tool_choice is auto, none, required, {type: function, name} or {type: allowed_tools, mode, tools}",
        param="tool_choice",
    )


def _allowed_functions(choice: dict[str, Any]) -> dict[str, Any]:
    """An ``allowed_tools`` choice's ``mode`` and functions in chat's shape (namespaced ones by
    their flat names); the hosted tools it lists are left out, as ``tool_plan`` leaves them out of
    the prompt.

    Raises:
        OpenAIError: 400 naming ``tool_choice`` for another shape: a ``mode`` other than ``auto``
            or ``required``, an entry that is not a tool's type and name.
    """
    listed, mode = choice.get("tools"), choice.get("mode")
    shape = "allowed_tools is {type: allowed_tools, mode: auto | required, tools: [{type: function, name}]}"
    if mode not in ("auto", "required") or not isinstance(listed, list):
        raise OpenAIError(400, shape, param="tool_choice")
    functions = []
    for tool in listed:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            name, namespace = tool.get("name"), tool.get("namespace")
            if not isinstance(name, str) or not isinstance(namespace, str | None):
                raise OpenAIError(400, shape, param="tool_choice")
            functions.append({"type": "function", "function": {"name": flat_name(name, namespace)}})
        elif not isinstance(kind, str):
            raise OpenAIError(400, shape, param="tool_choice")
    return {"mode": mode, "tools": functions}


def add_warning(headers: dict[str, str], plan: ToolPlan) -> None:
    """Name the tools ``plan`` left out in ``headers``' ``x-kvproxy-warning``, after the
    warnings it already holds (``proxy.http.warnings``)."""
    if (warning := plan.warning()) is not None:
        held = [headers[WARNING_HEADER]] if WARNING_HEADER in headers else []
        headers.update(warning_headers([*held, warning]))
