"""What the Messages API asks of a body's text beyond its types, refused in Anthropic's words, and
the prefill: a final assistant turn that the answer continues.

Source: Anthropic's Messages API reference ("if the final message uses the assistant role, the
response content will continue immediately from the content in that message") and the 400
``invalid_request_error`` messages its API answers: "text content blocks must be non-empty",
"text content blocks must contain non-whitespace text", "all messages must have non-empty
content except for the optional final assistant message", "final assistant content cannot end
with trailing whitespace".
"""

from __future__ import annotations

from typing import Any

from proxy.anthropic.protocol import ContentBlock, MessagesRequest

EMPTY = "text content blocks must be non-empty"
BLANK = "text content blocks must contain non-whitespace text"
NO_CONTENT = "all messages must have non-empty content except for the optional final assistant message"
TRAILING = "final assistant content cannot end with trailing whitespace"


def content_error(body: MessagesRequest) -> tuple[str, str] | None:
    """``(param, reason)`` for the first text Anthropic refuses, if any: an empty text block (in
    ``system``, a message, or a ``tool_result``'s content), a message's text block of whitespace
    only, a message with no content (but a final assistant one: an empty prefill is none), a
    final assistant turn ending in whitespace or holding a ``tool_use`` (its result must follow)."""
    for i, block in enumerate(body.system if isinstance(body.system, list) else []):
        if block.type == "text" and not block.text:
            return f"system[{i}].text", EMPTY
    last = len(body.messages) - 1
    for i, message in enumerate(body.messages):
        prefill = i == last and message.role == "assistant"
        if not message.content:
            if prefill:
                continue
            return f"messages[{i}].content", NO_CONTENT
        texts = _texts(f"messages[{i}].content", message.content)
        for param, text in texts:
            if not text:
                return param, EMPTY
            if not text.strip():
                return param, BLANK
        if prefill:
            blocks = message.blocks()
            calls = [j for j, b in enumerate(blocks) if b.type == "tool_use"]
            if calls:
                return (
                    f"messages[{i}].content[{calls[0]}]",
                    "a final assistant turn cannot hold a tool_use: its tool_result follows in a user turn",
                )
            param, text = texts[-1] if texts else ("", "")
            if text and text != text.rstrip():
                return param, TRAILING
    return None


def prefill(body: MessagesRequest) -> str | None:
    """The text the answer continues: the final message's, when it is the assistant's and holds
    text (validated by ``content_error``); else None (an empty final assistant turn is none)."""
    final = body.turns()[-1]
    if final.role != "assistant":
        return None
    text = "".join(b.text or "" for b in final.blocks() if b.type == "text")
    return text or None


def _texts(param: str, content: str | list[ContentBlock]) -> list[tuple[str, str | None]]:
    """``(param, text)`` of every text block of a message's ``content`` (``param``), those inside
    its ``tool_result`` blocks included."""
    if isinstance(content, str):
        return [(param, content)]
    out: list[tuple[str, str | None]] = []
    for j, block in enumerate(content):
        if block.type == "text":
            out.append((f"{param}[{j}].text", block.text))
        inner: Any = (block.model_extra or {}).get("content") if block.type == "tool_result" else None
        for k, part in enumerate(inner if isinstance(inner, list) else []):
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                out.append((f"{param}[{j}].content[{k}].text", text if isinstance(text, str) else None))
    return out
