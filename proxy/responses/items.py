"""Responses items: the ``input`` a client sends, written the one way kvproxy keeps them (each
with an id, as ``input_items`` lists them), as chat messages (what the chat template renders),
and the ``output`` items of an answer.

Input items served: messages (``user``, ``system``, ``developer``, ``assistant``; text parts
``input_text``, ``output_text`` and an assistant's ``refusal``), ``function_call`` and
``function_call_output``. A ``function_call`` and the assistant message before it are one
assistant turn with tool calls, as the chat API writes it. Source: the OpenAI API reference,
Responses (input items; output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.http.errors import OpenAIError
from proxy.responses.replies import (
    FunctionCall,
    InputItem,
    Item,
    ItemText,
    OutputItem,
    OutputMessage,
    OutputText,
    Status,
)
from proxy.tools.limits import MAX_SCHEMA_DEPTH
from proxy.tools.rendering import TemplateMessage
from proxy.tools.spec import NOT_JSON, OpenAICall, OpenAIFunction, ToolCall, call_id, json_value

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def input_items(value: str | list[dict[str, Any]]) -> list[InputItem]:
    """``input`` as items, each with a ``type`` and an ``id`` (a string is one user message).

    Raises:
        OpenAIError: 400 naming ``input[i]...``: an item kvproxy cannot serve (images, files,
            hosted tools' items, references), a message without a role it knows, a call
            without its ``call_id``, ``name`` or string ``arguments``.
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
        return {
            "id": item.get("id") or call_id("fc_"),
            "type": "function_call",
            "status": "completed",
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": item["arguments"],
        }
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise OpenAIError(
                400, "a function_call_output has the `call_id` it answers", param=f"input[{i}].call_id"
            )
        output = _text(item.get("output"), f"input[{i}].output")
        return {
            "id": item.get("id") or call_id("fco_"),
            "type": kind,
            "call_id": item["call_id"],
            "output": output,
        }
    raise OpenAIError(
        400,
        f"input items of type `{kind}` are not supported; send messages, function_call and "
        "function_call_output items",
        param=f"input[{i}].type",
    )


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


def check_calls(history: list[TemplateMessage], items: list[InputItem]) -> None:
    """Each ``function_call_output`` answers a call made before it (in the stored history or
    an earlier item), and each ``function_call``'s arguments are JSON.

    Raises:
        OpenAIError: 400 naming ``input[i]...``.
    """
    made = {call.get("id") for message in history for call in message.get("tool_calls") or []}
    for i, item in enumerate(items):
        if item["type"] == "function_call":
            if item["arguments"] != "" and json_value(item["arguments"]) is NOT_JSON:
                reason = f"a function_call's arguments are JSON text, at most {MAX_SCHEMA_DEPTH} levels deep"
                raise OpenAIError(400, reason, param=f"input[{i}].arguments")
            made.add(item["call_id"])
        elif item["type"] == "function_call_output" and item["call_id"] not in made:
            reason = f"no function_call with call_id '{item['call_id']}' comes before this output"
            raise OpenAIError(400, reason, param=f"input[{i}].call_id")


def chat_messages(items: Sequence[Item]) -> list[TemplateMessage]:
    """Items (as ``input_items`` and ``output_items`` write them) as chat messages, in order."""
    messages: list[TemplateMessage] = []
    for item in items:
        last = messages[-1] if messages else None
        if item["type"] == "message":
            text = item["content"][0]["text"]
            messages.append({"role": item["role"], "content": text})
        elif item["type"] == "function_call":
            function: OpenAIFunction = {"name": item["name"], "arguments": item["arguments"]}
            call: OpenAICall = {"id": item["call_id"], "type": "function", "function": function}
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls") and not message["content"]:
            message["content"] = None
    return messages


def output_items(text: str, calls: list[ToolCall], complete: bool) -> list[OutputItem]:
    """An answer's output: a message with its text (when it has text, or no calls), then one
    ``function_call`` item per call."""
    items: list[OutputItem] = [message_item(call_id("msg_"), text, complete)] if text or not calls else []
    return items + [call_item(call_id("fc_"), call.id, call.name, call.arguments) for call in calls]


def message_item(item_id: str, text: str | None, complete: bool = True) -> OutputMessage:
    """An output message (``text`` None: just opened, no content part yet)."""
    content = [] if text is None else [text_part(text)]
    status: Status = "in_progress" if text is None else "completed" if complete else "incomplete"
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> OutputText:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, done: bool = True) -> FunctionCall:
    status: Status = "completed" if done else "in_progress"
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
