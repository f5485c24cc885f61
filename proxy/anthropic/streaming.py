"""The Messages API's streamed events: ``message_start``; per content block (text, then each
``tool_use``) ``content_block_start``, its deltas (``text_delta``, ``input_json_delta``) and
``content_block_stop``; ``message_delta`` (stop reason, the usage counts so far: input, cache
read, cache creation, output); ``message_stop``; an ``error`` event if generation fails.

Source: Anthropic's API reference, Streaming Messages.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping

from engine.requests import Failed, Finished, TokenDelta
from proxy.anthropic import protocol
from proxy.anthropic.protocol import CacheCreation
from proxy.anthropic.tools import ReplyBlock, TextBlock, tool_use
from proxy.serving.starting import Begun
from proxy.tools.spec import Arguments, CallStart, Piece, Text


class _Blocks:
    """The open content block and the events that open, fill and close blocks."""

    def __init__(self) -> None:
        self.index, self.kind = -1, ""

    def say(self, piece: Piece) -> list[str]:
        if isinstance(piece, Arguments):
            delta = {"type": "input_json_delta", "partial_json": piece.text}
            return [_event("content_block_delta", {"index": self.index, "delta": delta})]
        out: list[str] = []
        if isinstance(piece, CallStart):
            out += self._open("tool_use", tool_use(piece.id, piece.name, {}))
        elif self.kind != "text":
            out += self._open("text", TextBlock(type="text", text=""))
        if isinstance(piece, Text):
            delta = {"type": "text_delta", "text": piece.text}
            out.append(_event("content_block_delta", {"index": self.index, "delta": delta}))
        return out

    def _open(self, kind: str, block: ReplyBlock) -> list[str]:
        out = self.close()
        self.index, self.kind = self.index + 1, kind
        return [*out, _event("content_block_start", {"index": self.index, "content_block": block})]

    def close(self) -> list[str]:
        if not self.kind:
            return []
        self.kind = ""
        return [_event("content_block_stop", {"index": self.index})]


async def events(begun: Begun, message_id: str, model: str, split: CacheCreation) -> AsyncIterator[str]:
    """The event sequence of one streamed reply (see the module docstring); ``split``: the
    ``cache_creation`` split of the prompt's tokens newly stored."""
    running = begun.started.running
    answer, blocks = begun.plan.stream(), _Blocks()
    try:
        start = protocol.message(message_id, model, [], None, protocol.usage(begun.usage(0), split))
        yield _event("message_start", {"message": start})
        async for event in running:
            if isinstance(event, TokenDelta) and event.text:
                for line in [e for piece in answer.feed(event.text) for e in blocks.say(piece)]:
                    yield line
            elif isinstance(event, Finished):
                pieces, calls = answer.finish(event.text)
                if not pieces and blocks.index < 0:
                    pieces = [Text("")]
                for line in [e for piece in pieces for e in blocks.say(piece)] + blocks.close():
                    yield line
                reason = protocol.stop_reason(event, bool(calls))
                delta = {"stop_reason": reason, "stop_sequence": event.stop_sequence}
                # NOTE: cumulative counts, as the SDK's MessageDeltaUsage has them, and the
                # cache_creation split beside them: clients such as LangChain's ChatAnthropic read
                # a stream's input and cache counts here, as they read a reply's usage
                final = protocol.usage(begun.usage(event.completion_tokens), split)
                yield _event("message_delta", {"delta": delta, "usage": final})
                yield _event("message_stop", {})
            elif isinstance(event, Failed):
                yield _event("error", {"error": {"type": "api_error", "message": "internal server error"}})
    finally:
        running.cancel()


def _event(kind: str, data: Mapping[str, object]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"
