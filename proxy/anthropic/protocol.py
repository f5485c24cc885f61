"""The Anthropic Messages API (``POST /v1/messages``): request models, prompt caching with
``cache_control`` breakpoints, usage and the streamed event sequence.

Source: Anthropic's API reference, Messages and Prompt caching. Usage in their meaning:
``cache_read_input_tokens`` were served from the cache, ``cache_creation_input_tokens`` are the
prompt's tokens this request stored (those not cached, up to the end of the prompt: its blocks and
tail; without tails, its full blocks), ``input_tokens`` the rest; the three add up to the prompt's
length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

if TYPE_CHECKING:  # NOTE: the router parses Messages bodies and never imports torch
    from engine.requests import Finished
    from proxy.serving.turn import Usage


TTL_S = {"5m": 300, "1h": 3600}
"""``cache_control.ttl`` in seconds (absent: 5 minutes)."""
MAX_BREAKPOINTS = 4
"""Anthropic's most ``cache_control`` marks in one request."""

Real = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class CacheControl(_Lenient):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class ContentBlock(_Lenient):
    type: str
    text: str | None = None
    cache_control: CacheControl | None = None


class Message(_Lenient):
    role: Literal["user", "assistant", "system"]  # NOTE: system: a mid-conversation instruction
    content: str | list[ContentBlock]

    def blocks(self) -> list[ContentBlock]:
        return (
            [ContentBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content
        )


class MessagesRequest(_Lenient):
    model: str
    max_tokens: Annotated[StrictInt, Field(ge=1)]  # NOTE: required, as Anthropic requires it
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    temperature: Real | None = Field(None, ge=0, le=1)
    top_p: Real | None = Field(None, gt=0, le=1)
    stop_sequences: list[str] | None = None
    stream: StrictBool = False
    cache_control: CacheControl | None = None  # NOTE: automatic caching: the last block's breakpoint

    def turns(self) -> list[Message]:
        """The messages with consecutive ones of one role combined into one turn, their blocks in
        order, as Anthropic's Messages API combines them ("consecutive user or assistant turns
        in your request will be combined into a single turn"): a prefill sent as two assistant
        messages is one prefill."""
        turns: list[Message] = []
        for message in self.messages:
            if turns and turns[-1].role == message.role:
                turns[-1] = Message(role=message.role, content=turns[-1].blocks() + message.blocks())
            else:
                turns.append(message)
        return turns

    def unsupported_field(self) -> tuple[str, str] | None:
        """``(param, reason)`` for the first field this server cannot honour, if any."""
        if (self.model_extra or {}).get("top_k") is not None:
            return "top_k", "`top_k` is not supported by this server"
        system = self.system if isinstance(self.system, list) else []
        for i, block in enumerate(system):
            if block.type != "text":
                return (
                    f"system[{i}].type",
                    f"system blocks of type `{block.type}` are not supported; send text",
                )
        made: set[Any] = set()
        for i, message in enumerate(self.messages):
            allowed = BLOCK_TYPES[message.role]
            for j, block in enumerate(message.blocks()):
                extra = block.model_extra or {}
                if block.type == "tool_use":
                    made.add(extra.get("id"))
                if block.type == "tool_result" and extra.get("tool_use_id") not in made:
                    return (
                        f"messages[{i}].content[{j}].tool_use_id",
                        "a tool_result answers a tool_use block before it (its tool_use_id)",
                    )
                if block.type not in allowed:
                    return (
                        f"messages[{i}].content[{j}].type",
                        f"{message.role} content blocks of type `{block.type}` are not supported; "
                        f"send {', '.join(allowed)}",
                    )
                inner = (block.model_extra or {}).get("content") if block.type == "tool_result" else None
                for k, part in enumerate(inner if isinstance(inner, list) else []):
                    if not isinstance(part, dict) or part.get("type") != "text":
                        return (
                            f"messages[{i}].content[{j}].content[{k}].type",
                            "tool results other than text are not supported; send text",
                        )
        return None


BLOCK_TYPES = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
    "system": ("text",),
}
"""The content blocks each role may send (an assistant's thinking blocks are not rendered:
``proxy.anthropic.thinking``)."""


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``: a Messages body without ``max_tokens``."""

    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None  # type: ignore[assignment]


class CacheCreation(TypedDict):
    """``usage.cache_creation``: the prompt's tokens this request stored, by how long they are
    kept (``proxy.anthropic.caching.creation``)."""

    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class MessagesUsage(TypedDict):
    """A Messages response's ``usage`` (and a streamed ``message_start``'s and
    ``message_delta``'s: ``MessageDeltaUsage``, cumulative)."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int
    cache_creation: CacheCreation


def usage(counts: Usage, split: CacheCreation) -> MessagesUsage:
    """Anthropic usage of a request: ``cache_read_input_tokens`` read from the cache,
    ``cache_creation_input_tokens`` newly stored (``proxy.serving.running.written_tokens``; split
    by TTL in ``cache_creation``), ``input_tokens`` the rest of the prompt."""
    return {
        "input_tokens": counts.uncached_tokens,
        "cache_creation_input_tokens": counts.written_tokens,
        "cache_read_input_tokens": counts.cached_tokens,
        "output_tokens": counts.completion_tokens,
        "cache_creation": split,
    }


def stop_reason(finished: Finished, called: bool = False) -> str:
    """``end_turn`` (the model ended), ``tool_use`` (it ended with calls), ``max_tokens`` or
    ``stop_sequence``."""
    if finished.finish_reason == "length":
        return "max_tokens"
    if finished.stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if called else "end_turn"


class MessageObject(TypedDict):
    """A Messages API response object: ``content`` its blocks (text, tool use), ``stop_reason``
    and ``stop_sequence`` None until it has finished."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: Sequence[Mapping[str, object]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: MessagesUsage


def message(
    message_id: str,
    model: str,
    content: Sequence[Mapping[str, object]],
    finished: Finished | None,
    usage: MessagesUsage,
) -> MessageObject:
    """A Messages API response object (no ``finished``: the empty message of ``message_start``)."""
    called = any(block["type"] == "tool_use" for block in content)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(finished, called) if finished else None,
        "stop_sequence": finished.stop_sequence if finished else None,
        "usage": usage,
    }
