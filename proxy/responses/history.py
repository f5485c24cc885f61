"""Responses items as the chat messages the template renders, and the check that each result
answers a call made before it.

Every item a client keeps in its history is accepted, as the hosted API accepts it (a
conversation whose history holds an item the server refuses could never be resumed):

- messages are chat messages; the calls of every kind the client runs itself (``CALLS``) are the
  assistant's tool calls (a function by its flat name, ``proxy.responses.tools.flat_name``; the
  others by their kind's name, the payload as arguments); their results (``OUTPUTS``) are tool
  messages answering ``call_id``; a ``function_call_output`` without a ``call_id`` (a result the
  client adds on its own: Codex's goals) is a tool message naming its tool;
- the hosted model's own items (``NOT_SHOWN``: reasoning, compaction, the calls hosted tools ran)
  are kept and listed but not shown: the local model cannot read them, and they do not move the
  conversation on by themselves.

Source: the OpenAI API reference, Responses (input items); Codex's ``ResponseItem``
(openai/codex, ``codex-rs/protocol``) for what an agent keeps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.http.errors import OpenAIError
from proxy.responses.replies import Item
from proxy.responses.tools import flat_name
from proxy.tools.rendering import TemplateMessage
from proxy.tools.spec import OpenAICall, OpenAIFunction

CALLS = {
    "function_call": "arguments",
    "custom_tool_call": "input",
    "local_shell_call": "action",
    "shell_call": "action",
    "apply_patch_call": "operation",
    "computer_call": "action",
}
"""Calls the client runs, each kind -> the field its arguments are in."""
OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "computer_call_output",
    }
)
"""Their results."""
NOT_SHOWN = frozenset(
    {
        "reasoning",
        "compaction",
        "compaction_summary",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
    }
)
"""The hosted model's own items: kept, not rendered."""


def chat_messages(items: Sequence[Item]) -> list[TemplateMessage]:
    """Items (as ``items.input_items`` and ``items.output_items`` write them) as chat messages,
    in order: a call joins the assistant message before it."""
    messages: list[TemplateMessage] = []
    for item in items:
        fields: Mapping[str, Any] = item
        kind = fields["type"]
        if kind == "message":
            messages.append({"role": fields["role"], "content": fields["content"][0]["text"]})
        elif kind in CALLS:
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(_call(fields))
        elif kind in OUTPUTS:
            messages.append(_result(fields))
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls") and not message["content"]:
            message["content"] = None
    return messages


def _call(item: Mapping[str, Any]) -> OpenAICall:
    kind, payload = item["type"], item.get(CALLS[item["type"]])
    name: str = item.get("name") or kind.removesuffix("_call")
    if kind == "function_call":
        name, arguments = flat_name(name, item.get("namespace")), str(payload)
    else:
        value = {"input": payload} if isinstance(payload, str) else payload
        arguments = json.dumps(value, ensure_ascii=False)
    function: OpenAIFunction = {"name": name, "arguments": arguments}
    return {"id": item["call_id"], "type": "function", "function": function}


def _result(item: Mapping[str, Any]) -> TemplateMessage:
    output = item.get("output")
    if isinstance(output, list):  # NOTE: text parts; a hosted tool's screenshots are not read
        output = "".join(p["text"] for p in output if isinstance(p, dict) and isinstance(p.get("text"), str))
    elif not isinstance(output, str):
        output = json.dumps(output, ensure_ascii=False)
    if (answers := answered(item)) is not None:
        return {"role": "tool", "tool_call_id": answers, "content": output}
    return {"role": "tool", "name": flat_name(item["name"], item.get("namespace")), "content": output}


def answered(item: Mapping[str, Any]) -> str | None:
    """The call id a result answers (a local shell call's result names it by ``id``)."""
    answers = item.get("call_id")
    if answers is None and item["type"] == "local_shell_call_output":
        answers = item.get("id")
    return answers if isinstance(answers, str) else None


def check_calls(history: list[TemplateMessage], items: Sequence[Item]) -> None:
    """Each result with a call id answers a call made before it (in the stored history or an
    earlier item). A ``function_call``'s arguments are any text: JSON, or a call cut short as
    the client got it, rendered as its text (as is JSON nested past the depth limit).

    Raises:
        OpenAIError: 400 naming ``input[i]...``.
    """
    made = {call.get("id") for message in history for call in message.get("tool_calls") or []}
    for i, item in enumerate(items):
        fields: Mapping[str, Any] = item
        kind = fields["type"]
        if kind in CALLS:
            made.add(fields["call_id"])
        elif kind in OUTPUTS and (answers := answered(fields)) is not None and answers not in made:
            reason = f"no call with call_id '{answers}' comes before this output"
            raise OpenAIError(400, reason, param=f"input[{i}].call_id")
