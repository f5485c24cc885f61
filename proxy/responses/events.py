"""A streamed response: the Responses API's server-sent events, in their documented order.

    response.created, response.in_progress,
    per output item: response.output_item.added, then for a message
        response.content_part.added, response.output_text.delta..., response.output_text.done,
        response.content_part.done; for a call response.function_call_arguments.delta...,
        response.function_call_arguments.done; then response.output_item.done,
    response.completed (response.incomplete when it ran out of ``max_output_tokens``;
    response.failed when it failed; an ``error`` event and response.failed when the context
    window ended it, ``proxy.responses.limits``, the open item then left open, so that a client
    runs no call cut short)

Each event is ``event: {type}`` and ``data: {json}`` with a ``sequence_number``; no ``[DONE]``.
Source: the OpenAI API reference, Responses streaming events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from engine.requests import Failed, Finished, TokenDelta
from proxy.responses.items import call_item, message_item, text_part
from proxy.responses.replies import ItemPlace, OutputItem, ResponseError, ResponseObject
from proxy.responses.tools import ToolPlan
from proxy.serving.running import Started
from proxy.tools.answer import AnswerPlan
from proxy.tools.spec import Arguments, CallStart, Piece, Text, call_id

Finish = Callable[[list[OutputItem], Finished, list[int], str], Awaitable[ResponseObject]]
"""Completes the response from its output items, the ``Finished`` event, the generated token ids
and their text (and stores it); returns the response object (``status`` failed, nothing stored,
when the context window ended it)."""


class ResponseEvents:
    """The events of one response as its answer's pieces arrive (``events``)."""

    def __init__(self, tools: ToolPlan | None = None) -> None:
        self.tools = ToolPlan() if tools is None else tools
        self.sequence = 0
        self.output: list[OutputItem] = []
        self._open: OutputItem | None = None

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence} | fields
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def pieces(self, pieces: list[Piece]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, Text) and piece.text:
                if self._open is None or self._open["type"] != "message":
                    out += self._close() + self._add(message_item(call_id("msg_"), None))
                assert self._open is not None and self._open["type"] == "message"
                self._open["content"][0]["text"] += piece.text
                out.append(self._delta("response.output_text.delta", piece.text))
            elif isinstance(piece, CallStart):
                name, namespace = self.tools.call_name(piece.name)
                call = call_item(call_id("fc_"), piece.id, name, "", False, namespace)
                out += self._close() + self._add(call)
            elif isinstance(piece, Arguments) and self._open is not None:
                assert self._open["type"] == "function_call"  # NOTE: a call's arguments follow its start
                self._open["arguments"] += piece.text
                out.append(self._delta("response.function_call_arguments.delta", piece.text))
        return out

    def failure(self, failed: ResponseObject, param: str | None = "input") -> list[str]:
        """The events of a request over the context window (``failed``'s ``error``; ``param``
        the field it names): an ``error`` event, then ``response.failed``, as the hosted API ends
        such a stream."""
        error = failed["error"]
        assert error is not None
        fields = {"code": error["code"], "message": error["message"], "param": param}
        # NOTE: the reference documents the error event's fields flat; the hosted API has been seen
        # sending them under ``error`` (the openai SDKs raise it as an APIError): both are here
        said = self.event("error", **fields, error={"type": "invalid_request_error", **fields})
        return [said, self.event("response.failed", response=failed)]

    def end(self, complete: bool) -> list[str]:
        """Close the open item (a message with no text when there was none at all)."""
        opened = [] if self.output else self._add(message_item(call_id("msg_"), None))
        return opened + self._close(complete)

    def _add(self, item: OutputItem) -> list[str]:
        """Open ``item``: its ``output_item.added`` event (and a message's ``content_part.added``)."""
        self.output.append(item)
        self._open = item
        if item["type"] != "message":
            return [self._added_event()]
        added = self._added_event()
        item["content"] = [text_part("")]
        return [added, self._part_event("response.content_part.added", "")]

    def _added_event(self) -> str:
        assert self._open is not None
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=self._open)

    def _where(self) -> ItemPlace:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1}

    def _part_event(self, kind: str, text: str) -> str:
        return self.event(kind, **self._where(), content_index=0, part=text_part(text))

    def _delta(self, kind: str, delta: str) -> str:
        extra = {"content_index": 0, "logprobs": []} if kind.startswith("response.output_text") else {}
        return self.event(kind, **self._where(), **extra, delta=delta)

    def _close(self, complete: bool = True) -> list[str]:
        item, out = self._open, list[str]()
        if item is None:
            return out
        if item["type"] == "message":
            text = item["content"][0]["text"]
            item["status"] = "completed" if complete else "incomplete"
            out.append(
                self.event(
                    "response.output_text.done", **self._where(), content_index=0, text=text, logprobs=[]
                )
            )
            out.append(self._part_event("response.content_part.done", text))
        else:  # NOTE: only the last call can be cut short (its arguments then not JSON)
            item["status"] = "completed" if complete else "incomplete"
            out.append(
                self.event(
                    "response.function_call_arguments.done", **self._where(), arguments=item["arguments"]
                )
            )
        out.append(self.event("response.output_item.done", output_index=len(self.output) - 1, item=item))
        self._open = None
        return out


async def events(
    started: Started,
    plan: AnswerPlan,
    response: ResponseObject,
    finish: Finish,
    tools: ToolPlan,
    ended: Callable[[Finished], bool],
) -> AsyncIterator[str]:
    """The response's events (calls named as ``tools`` offered them); ``finish`` completes (and
    stores) it at the end; ``ended`` says whether the context window ended it. A client that
    goes away cancels the generation, and nothing is stored."""
    writer, answer, generated, text = ResponseEvents(tools), plan.stream(), [], []
    try:
        yield writer.event("response.created", response=response)
        yield writer.event("response.in_progress", response=response)
        async for event in started.running:
            if isinstance(event, TokenDelta):
                generated.append(event.token_id)
                text.append(event.text)
                for said in writer.pieces(answer.feed(event.text)):
                    yield said
            elif isinstance(event, Finished) and ended(event):
                failed = await finish([], event, generated, "".join(text) + event.text)
                for said in writer.failure(failed):
                    yield said
            elif isinstance(event, Finished):
                pieces, _ = answer.finish(event.text)
                complete = event.finish_reason != "length"
                for said in writer.pieces(pieces) + writer.end(complete):
                    yield said
                done = await finish(writer.output, event, generated, "".join(text) + event.text)
                kind = "response.completed" if complete else "response.incomplete"
                yield writer.event(kind, response=done)
            elif isinstance(event, Failed):
                error: ResponseError = {"code": "server_error", "message": "internal server error"}
                failed = response | {"status": "failed", "error": error}
                yield writer.event("response.failed", response=failed)
    finally:
        started.running.cancel()
