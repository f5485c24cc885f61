"""The usage of one model response, read from what a server sent: a JSON body or a stream of SSE
events, in any of the three dialects an agent speaks.

Prompt tokens are the whole prompt, cached tokens the part the server reused:

- Anthropic Messages: ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``
  (``input_tokens`` counts only the uncached rest), of which ``cache_read_input_tokens`` cached;
- OpenAI Responses: ``input_tokens``, of which ``input_tokens_details.cached_tokens``;
- OpenAI chat completions: ``prompt_tokens``, of which ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# NOTE: the output items that are a call of the agent's tools, per dialect: Anthropic's content
# block, the Responses items Codex runs (a function, a freeform tool, its shell), a chat tool call.
TOOL_ITEMS = frozenset({"tool_use", "function_call", "custom_tool_call", "local_shell_call"})


@dataclass
class Usage:
    """What one response reported: ``prompt`` and ``cached`` tokens (None until a usage was read),
    the tool calls it made, and how it ended (``stop_reason``/``status``/``finish_reason``)."""

    prompt: int | None = None
    cached: int | None = None
    tool_calls: int = 0
    ended: str | None = None
    errors: list[str] = field(default_factory=list)

    def read(self, event: dict[str, Any]) -> None:
        """Take what one JSON object (a whole body or one SSE event's data) says."""
        if not isinstance(event, dict):
            return
        if isinstance(event.get("error"), dict):
            self.errors.append(str(event["error"].get("message", event["error"]))[:500])
        for holder in (event, event.get("message"), event.get("response")):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                self._usage(holder["usage"])
            if isinstance(holder, dict):
                self._ending(holder)
        self._tools(event)

    def _usage(self, usage: dict[str, Any]) -> None:
        if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
            read = usage.get("cache_read_input_tokens") or 0
            made = usage.get("cache_creation_input_tokens") or 0
            if usage.get("input_tokens") is not None:
                self.prompt, self.cached = usage["input_tokens"] + read + made, read
        elif "input_tokens" in usage:
            details = usage.get("input_tokens_details") or {}
            self.prompt, self.cached = usage["input_tokens"], details.get("cached_tokens") or 0
        elif "prompt_tokens" in usage:
            details = usage.get("prompt_tokens_details") or {}
            self.prompt, self.cached = usage["prompt_tokens"], details.get("cached_tokens") or 0

    def _ending(self, holder: dict[str, Any]) -> None:
        for key in ("stop_reason", "finish_reason"):
            if holder.get(key):
                self.ended = str(holder[key])
        if holder.get("object") == "response" and holder.get("status") not in (None, "in_progress"):
            reason = (holder.get("incomplete_details") or {}).get("reason")
            self.ended = f"{holder['status']}" + (f": {reason}" if reason else "")
        if isinstance(holder.get("delta"), dict) and holder["delta"].get("stop_reason"):
            self.ended = str(holder["delta"]["stop_reason"])

    def _tools(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "content_block_start":  # Anthropic, streamed
            self.tool_calls += (event.get("content_block") or {}).get("type") == "tool_use"
        elif kind == "response.output_item.done":  # Responses, streamed
            self.tool_calls += (event.get("item") or {}).get("type") in TOOL_ITEMS
        elif kind == "message" and isinstance(event.get("content"), list):  # Anthropic, whole
            self.tool_calls += sum(b.get("type") == "tool_use" for b in event["content"])
        elif event.get("object") == "response" and "usage" in event:  # Responses, whole
            self.tool_calls += sum(i.get("type") in TOOL_ITEMS for i in event.get("output") or [])
        for choice in event.get("choices") or []:  # chat completions: count each call once
            message = choice.get("message") or choice.get("delta") or {}
            self.tool_calls += sum("id" in c and c.get("id") for c in message.get("tool_calls") or [])


class SseReader:
    """Reads SSE bytes as they arrive (split anywhere) into a ``Usage``."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._buffer = b""

    def feed(self, chunk: bytes) -> None:
        """Read every whole event ``chunk`` completes."""
        self._buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            if data and data != b"[DONE]":
                try:
                    self.usage.read(json.loads(data))
                except ValueError:
                    continue
