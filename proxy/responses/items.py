"""Responses items: the ``input`` a client sends, written the one way kvproxy keeps them (each
with an id, as ``input_items`` lists them), and the ``output`` items of an answer
(``proxy.responses.history`` renders both as chat messages).

Input items served: messages (``user``, ``system``, ``developer``, ``assistant``; text parts
``input_text``, ``output_text`` and an assistant's ``refusal``), ``function_call`` (with the
``namespace`` of its function, if any) and ``function_call_output`` (answering its ``call_id``,
or without one naming its tool), and every other item a client keeps in its history
(``history.CALLS``, ``history.OUTPUTS``, ``history.NOT_SHOWN``), kept as sent. Source: the
OpenAI API reference, Responses (input items; output).
"""

from __future__ import annotations

from typing import Any, cast

from proxy.http.errors import OpenAIError
from proxy.responses.history import CALLS, NOT_SHOWN, OUTPUTS, answered
from proxy.responses.replies import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    ItemText,
    KeptItem,
    OutputItem,
    OutputMessage,
    OutputText,
    Status,
)
from proxy.responses.tools import ToolPlan
from proxy.tools.spec import ToolCall, call_id

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def input_items(value: str | list[dict[str, Any]]) -> list[InputItem]:
    """``input`` as items, each with a ``type`` and an ``id`` (a string is one user message).

    Raises:
        OpenAIError: 400 naming ``input[i]...``: an item kvproxy cannot serve (images, files,
            references, a type the API does not have), a message without a role it knows, a
            call without its ``call_id``, ``name`` or string ``arguments``, a result without
            a ``call_id`` or a ``name``.
    """
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    return [_item(item, i) for i, item in enumerate(value)]


def _item(item: object, i: int) -> InputItem:
    if not isinstance(item, dict):
        raise OpenAIError(400, "an input item is an object", param=f"input[{i}]")
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in ROLES:
            raise OpenAIError(400, f"a message's role is one of {', '.join(ROLES)}", param=f"input[{i}].role")
        part_type = "output_text" if item["role"] == "assistant" else "input_text"
        parts: list[ItemText] = [
            {"type": part_type, "text": _text(item.get("content"), f"input[{i}].content")}
        ]
        return {
            "id": item.get("id") or call_id("msg_"),
            "type": "message",
            "role": item["role"],
            "content": parts,
        }
    if kind == "function_call":
        for field in ("call_id", "name", "arguments"):
            if not isinstance(item.get(field), str):
                raise OpenAIError(400, f"a function_call has a string `{field}`", param=f"input[{i}].{field}")
        namespace = _optional_text(item, "namespace", i)
        return call_item(
            item.get("id") or call_id("fc_"),
            item["call_id"],
            item["name"],
            item["arguments"],
            namespace=namespace,
        )
    if kind == "function_call_output":
        return _output(item, i)
    if kind in CALLS or kind in OUTPUTS or kind in NOT_SHOWN:
        if (kind in CALLS and not isinstance(item.get("call_id"), str)) or (
            kind in OUTPUTS and answered(item) is None
        ):
            raise OpenAIError(400, f"a {kind} has a string `call_id`", param=f"input[{i}].call_id")
        return cast(KeptItem, item | {"id": item.get("id") or call_id("item_")})
    raise OpenAIError(
        400,
        f"input items of type `{kind}` are not supported; send messages, tool calls and their outputs",
        param=f"input[{i}].type",
    )


def _output(item: dict[str, Any], i: int) -> FunctionCallOutput:
    """A ``function_call_output``: answering its ``call_id``, or naming its tool without one."""
    answers, name = _optional_text(item, "call_id", i), _optional_text(item, "name", i)
    if answers is None and name is None:
        reason = "a function_call_output has the `call_id` it answers, or the `name` of its tool"
        raise OpenAIError(400, reason, param=f"input[{i}].call_id")
    output = _text(item.get("output"), f"input[{i}].output")
    out: FunctionCallOutput = {
        "id": item.get("id") or call_id("fco_"),
        "type": "function_call_output",
        "output": output,
    }
    if answers is not None:
        out["call_id"] = answers
    if name is not None:
        out["name"] = name
    if (namespace := _optional_text(item, "namespace", i)) is not None:
        out["namespace"] = namespace
    return out


def _optional_text(item: dict[str, Any], field: str, i: int) -> str | None:
    value = item.get(field)
    if value is not None and not isinstance(value, str):
        raise OpenAIError(400, f"`{field}` is a string", param=f"input[{i}].{field}")
    return value


def _text(content: object, param: str) -> str:
    """A message's content (a string or text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, "content is a string or a list of text parts", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            reason = f"content parts of type `{kind}` are not supported; send text"
            raise OpenAIError(400, reason, param=f"{param}[{j}]")
        field = "refusal" if kind == "refusal" else "text"
        if not isinstance(part.get(field), str):
            raise OpenAIError(400, f"a `{kind}` part has a string `{field}`", param=f"{param}[{j}].{field}")
        texts.append(part[field])
    return "".join(texts)


def output_items(text: str, calls: list[ToolCall], complete: bool, plan: ToolPlan) -> list[OutputItem]:
    """An answer's output: a message with its text (when it has text, or no calls), then one
    ``function_call`` item per call (a namespaced function's with its ``namespace``); the last
    item of an answer cut short (not ``complete``) is ``incomplete``."""
    items: list[OutputItem] = [message_item(call_id("msg_"), text, complete)] if text or not calls else []
    for call in calls:
        name, namespace = plan.call_name(call.name)
        items.append(call_item(call_id("fc_"), call.id, name, call.arguments, namespace=namespace))
    if not complete and items[-1]["type"] == "function_call":
        items[-1]["status"] = "incomplete"
    return items


def message_item(item_id: str, text: str | None, complete: bool = True) -> OutputMessage:
    """An output message (``text`` None: just opened, no content part yet)."""
    content = [] if text is None else [text_part(text)]
    status: Status = "in_progress" if text is None else "completed" if complete else "incomplete"
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> OutputText:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, done: bool = True, namespace: str | None = None
) -> FunctionCall:
    """A ``function_call`` item (with ``namespace`` when the function has one)."""
    status: Status = "completed" if done else "in_progress"
    item: FunctionCall = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item
