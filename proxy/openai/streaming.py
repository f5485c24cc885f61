"""OpenAI's streamed completions: ``data: {chunk}`` server-sent events ending with
``data: [DONE]``, the usage chunk last when asked (``stream_options.include_usage``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from engine.requests import Failed, Finished, TokenDelta
from proxy.openai.protocol import usage
from proxy.openai.replies import Chunk
from proxy.serving.running import Started
from proxy.serving.streaming import sse

ChunkBuilder = Callable[[str | None, list[TokenDelta], str | None], Chunk | None]
"""Builds one response chunk from (text delta or None, the tokens it carries, finish_reason);
None for a token's text that says nothing yet (a tool call's text held back until it parses)."""


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
    running = started.running
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
                    last = _said(chunk(None, [], None))
                    last["choices"] = []
                    counts = started.usage(event.completion_tokens)
                    last["usage"] = usage(
                        counts.prompt_tokens, counts.completion_tokens, counts.cached_tokens
                    )
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


def _said(chunk: Chunk | None) -> Chunk:
    assert chunk is not None  # NOTE: builders say something for every chunk but a token's text
    return chunk
