"""A chat with tools as the chat template renders it.

For a native format (``proxy.tools.formats``) the template gets the tool definitions and the
history's calls as it expects them (arguments as objects). For the generic format, kvproxy writes
them itself, in the system prompt and in the turns, exactly as the grammar makes the model write
them, so the next turn's prompt repeats an answer token for token (and its K/V stays cached):

- the tools, then the answer format, lead the system prompt (Anthropic's cache order: tools
  before the system prompt);
- an assistant's calls become ``{"tool_calls": [{"name": ..., "arguments": ...}]}`` and its
  text ``{"response": "..."}``;
- tool results (consecutive ones together) become a user turn ``{"tool_results": [...]}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.tools.formats import ToolFormat
from proxy.tools.rendering import TemplateMessage, render_chat
from proxy.tools.spec import (
    EMPTY_PARAMETERS,
    NOT_JSON,
    OpenAITool,
    Tool,
    ToolCall,
    ToolSet,
    canonical,
    dumps,
    json_value,
)

GENERIC_INSTRUCTIONS = (
    "You can call tools. They are listed below, one JSON Schema function definition per line.\n"
    "{tools}\n\n"
    "Answer with exactly one JSON object and nothing else:\n"
    '- to call tools: {{"tool_calls": [{{"name": "<tool name>", "arguments": {{<arguments>}}}}]}}\n'
    '- to answer the user: {{"response": "<your answer>"}}'
)


def generic_instructions(tools: ToolSet) -> str:
    """The system prompt's head that lists ``tools`` and the answer format."""
    return GENERIC_INSTRUCTIONS.format(tools="\n".join(dumps(t.as_openai()) for t in tools.tools))


def tool_messages(
    messages: list[TemplateMessage], tools: ToolSet | None, fmt: ToolFormat
) -> tuple[list[TemplateMessage], list[OpenAITool] | None]:
    """The messages to render and the ``tools`` argument of the template (None: none)."""
    if fmt.native:
        native = [_native_turn(m) for m in messages]
        return native, [t.as_openai() for t in tools.tools] if tools is not None and tools.tools else None
    if tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return messages, None
    return _generic_turns(messages, tools), None


def answer_turn(
    text: str, calls: Sequence[ToolCall], tools: ToolSet | None, fmt: ToolFormat
) -> TemplateMessage:
    """An answer's assistant message as a later request's history renders it (``tool_messages``
    of a history that holds it): its text, and its calls as the client sends them back (their
    ids, names and arguments as ``calls`` gives them; no text beside calls is ``None``)."""
    if not calls:
        message: TemplateMessage = {"role": "assistant", "content": text}
    else:
        message = {"role": "assistant", "content": text or None, "tool_calls": [c.as_openai() for c in calls]}
    if fmt.native:
        return _native_turn(message)
    if tools is None and not calls:
        return message
    return {"role": "assistant", "content": _generic_answer(message.get("tool_calls"), text)}


def _native_turn(message: TemplateMessage) -> TemplateMessage:
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call.get("function") or {})
        function["arguments"] = _arguments_object(function.get("arguments"))
        calls.append(call | {"function": function} | function)  # NOTE: some templates read the call itself
    return message | {"tool_calls": calls}


def _generic_turns(messages: list[TemplateMessage], tools: ToolSet | None) -> list[TemplateMessage]:
    names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for m in messages
        for call in m.get("tool_calls") or ()
    }
    out: list[TemplateMessage] = []
    for message in messages:
        role, text = message["role"], message.get("content") or ""
        if role == "assistant":
            out.append({"role": "assistant", "content": _generic_answer(message.get("tool_calls"), text)})
        elif role == "tool":
            result = {"name": names.get(message.get("tool_call_id")) or message.get("name"), "content": text}
            if out and out[-1].get("_results") is not None:
                out[-1]["_results"].append(result)
            else:
                out.append({"role": "user", "_results": [result]})
        else:
            out.append({k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")})
    for message in out:
        if (results := message.pop("_results", None)) is not None:
            message["content"] = dumps({"tool_results": results})
    if tools is not None and tools.tools:
        head = generic_instructions(tools)
        if out and out[0]["role"] == "system":
            out[0] = out[0] | {"content": f"{head}\n\n{out[0]['content']}"}
        else:
            out.insert(0, {"role": "system", "content": head})
    return out


def _generic_answer(calls: list[dict[str, Any]] | None, text: str) -> str:
    """An assistant turn as the generic grammar writes it (arguments as the client sent them)."""
    if not calls:
        return dumps({"response": text})
    parts = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if json_value(arguments) is NOT_JSON:
            arguments = dumps(canonical(_arguments_object(arguments)))
        parts.append(f'{{"name": {dumps(function.get("name") or "")}, "arguments": {arguments}}}')
    answer = '{"tool_calls": [' + ", ".join(parts) + "]"
    return answer + (f', "response": {dumps(text)}}}' if text else "}")


def _arguments_object(arguments: Any) -> Any:
    """Arguments as an object: JSON text parsed (templates ``tojson`` them)."""
    if isinstance(arguments, str):
        value = json_value(arguments)
        return arguments if value is NOT_JSON else value
    return {} if arguments is None else arguments


def tools_span(
    tokenizer: Any,
    messages: list[TemplateMessage],
    tools: ToolSet,
    fmt: ToolFormat,
    ids: list[int],
    data: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """``[start, end)``: the token positions of ``ids`` (the chat ``messages`` rendered with
    ``tools``) that depend on the tool definitions. Where they start is where the prompt differs
    from the same chat with another tool list; where they end, where it differs from a chat with
    the same tools and another first message. ``start == end`` when the template puts the tools
    after text that differs (a system prompt before them).

    Raises:
        RenderError: the template cannot render the chat.
    """
    other = ToolSet((Tool("_", "", EMPTY_PARAMETERS),))
    changed, changed_tools = tool_messages(messages, other, fmt)
    probe, probe_tools = tool_messages([{"role": "user", "content": _PROBE}], tools, fmt)
    start = common_prefix(ids, render_chat(tokenizer, changed, tools=changed_tools, template_kwargs=data))
    end = common_prefix(ids, render_chat(tokenizer, probe, tools=probe_tools, template_kwargs=data))
    return start, max(start, end)


_PROBE = "\u2063"
"""A first message no chat sends (an invisible separator)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
