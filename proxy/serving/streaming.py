"""Response shaping: a finished completion as JSON, a streamed one as server-sent events (OpenAI's
``data: {chunk}`` lines ending with ``data: [DONE]``), both with the cache headers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from engine.requests import Failed, Finished, TokenDelta
from proxy.openai.protocol import usage
from proxy.serving.explain import EXPLAIN_HEADER, EXPLANATION_FIELD, explanation_header
from proxy.serving.running import Started

ChunkBuilder = Callable[[str | None, list[TokenDelta], str | None], dict[str, Any] | None]
"""Builds one response chunk from (text delta or None, the tokens it carries, finish_reason);
None for a token's text that says nothing yet (a tool call's text held back until it parses)."""


def json_response(started: Started, body: dict[str, Any]) -> JSONResponse:
    """A finished completion: the cache headers, and the explanation in the body when asked."""
    if started.explanation is not None:
        body[EXPLANATION_FIELD] = started.explanation
    return JSONResponse(body, headers=started.headers)


def event_stream(started: Started, events: AsyncIterator[str]) -> StreamingResponse:
    """A streamed completion: the cache headers, and the explanation as a header when asked."""
    headers = started.headers
    if started.explanation is not None:
        headers = headers | {EXPLAIN_HEADER: explanation_header(started.explanation)}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def sse_stream(
    started: Started,
    chunk: ChunkBuilder,
    include_usage: bool,
    every_token: bool = False,
    first_text: str = "",
) -> AsyncIterator[str]:
    """Server-sent events of a streamed completion, ending with ``data: [DONE]``.

    A client that disconnects cancels this generator (Starlette cancels the response task), and
    with it the generation.

    Args:
        chunk: builds one chunk object.
        include_usage: send OpenAI's final usage chunk (empty ``choices``).
        every_token: one chunk per token even while its text is held back (for logprobs).
        first_text: text sent before the completion's (the prompt, for ``echo``).
    """
    running, done = started.running, started.done
    try:
        if first_text:
            yield sse(_said(chunk(first_text, [], None)))
        async for event in running:
            if isinstance(event, TokenDelta) and (event.text or every_token):
                if (said := chunk(event.text, [event], None)) is not None:
                    yield sse(said)
            elif isinstance(event, Finished):
                if event.text and (said := chunk(event.text, [], None)) is not None:
                    yield sse(said)
                yield sse(_said(chunk(None, [], event.finish_reason)))
                if include_usage:
                    last = _said(chunk(None, [], None)) | {"choices": []}
                    last["usage"] = usage(done.prompt_tokens, event.completion_tokens, done.cached_tokens)
                    yield sse(last)
            elif isinstance(event, Failed):
                error = {
                    "message": "internal server error",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
                yield sse({"error": error})
    finally:
        running.cancel()
    yield "data: [DONE]\n\n"


def _said(chunk: dict[str, Any] | None) -> dict[str, Any]:
    assert chunk is not None  # NOTE: builders say something for every chunk but a token's text
    return chunk


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def new_id(prefix: str, sep: str = "-") -> str:
    """A response id: ``chatcmpl-...`` (OpenAI's style) or, with ``sep="_"``, ``msg_...``."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
