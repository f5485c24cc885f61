"""The Responses API's words for a request over the model's context (``ContextExceeded``), in
the two shapes the hosted API answers with:

- without ``stream``: a 400 ``invalid_request_error`` with ``code: context_length_exceeded`` and
  ``param: input`` (or ``max_output_tokens`` when the input fits but not with it);
- with ``stream``: the refusal comes in the stream, as the hosted API sends it (the context is
  checked once the input is tokenized): ``response.created``, ``response.in_progress``, an
  ``error`` event, then ``response.failed`` whose ``response.error`` has the code. Codex reads
  only that last event (``response.error.code == "context_length_exceeded"``: it then compacts
  the conversation); a 400 before the stream would fail its turn instead.

The input's message starts with the hosted API's two sentences and adds the numbers. Source: the
hosted API's errors and events as quoted in clients' issue trackers and Codex's tests.
A request that sets no ``max_output_tokens`` asks for an answer up to the context; when the
window, not the server's ``--default-max-tokens``, ends it, the conversation no longer fits, and it
is reported the same way (``context_ended``): Codex compacts on it and fails the turn on
``response.incomplete``. A request that sets ``max_output_tokens`` asked for that many tokens at
most; running out of them stays ``incomplete`` (``max_output_tokens``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from engine.requests import Finished
from proxy.http.errors import OpenAIError
from proxy.responses.events import ResponseEvents
from proxy.responses.replies import ResponseError, ResponseObject
from proxy.serving.turn import Usage
from proxy.serving.validation import ContextExceeded

CODE = "context_length_exceeded"
MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."
"""The hosted API's words for it (clients match the code; some the words)."""


def context_error(exc: ContextExceeded) -> OpenAIError:
    """The refusal as the Responses API words it (see the module docstring)."""
    n, context = exc.prompt_tokens, exc.context
    if exc.prompt_alone or exc.max_tokens is None:
        message = (
            f"{MESSAGE} (input: {n} tokens; context window: {context} tokens, at least 1 of them for "
            "the output)"
        )
        return OpenAIError(400, message, param="input", code=CODE)
    message = (
        "Your input and max_output_tokens exceed the context window of this model: "
        f"{n} input tokens + {exc.max_tokens} > {context}. Please lower max_output_tokens or adjust "
        "your input and try again."
    )
    return OpenAIError(400, message, param="max_output_tokens", code=CODE)


def refused_stream(response: ResponseObject, error: OpenAIError) -> StreamingResponse:
    """A streamed request's refusal (``error``, from ``context_error``): ``response`` (the
    skeleton) created, in progress, then the ``error`` event and ``response.failed``."""
    return StreamingResponse(_refused_events(response, error), media_type="text/event-stream")


async def _refused_events(response: ResponseObject, error: OpenAIError) -> AsyncIterator[str]:
    writer = ResponseEvents()
    yield writer.event("response.created", response=response)
    yield writer.event("response.in_progress", response=response)
    failure: ResponseError = {"code": error.code or "", "message": error.message}
    for said in writer.failure(response | {"status": "failed", "error": failure}, error.param):
        yield said


def context_ended(
    finished: Finished, usage: Usage, context_length: int, max_output_tokens: int | None
) -> bool:
    """Whether the context window ended an answer that set no ``max_output_tokens``."""
    if finished.finish_reason != "length" or max_output_tokens is not None:
        return False
    return usage.prompt_tokens + usage.completion_tokens >= context_length


def _detail(usage: Usage, context_length: int) -> str:
    return (
        f"{MESSAGE} ({usage.prompt_tokens} prompt tokens and {usage.completion_tokens} generated "
        f"filled the model's context of {context_length} tokens.)"
    )


def failed_error(usage: Usage, context_length: int) -> ResponseError:
    """``response.error`` of a streamed response the window ended."""
    return {"code": CODE, "message": _detail(usage, context_length)}


def ended_error(usage: Usage, context_length: int) -> OpenAIError:
    """The 400 a non-streamed response the window ended is answered with (``param`` ``input``)."""
    return OpenAIError(400, _detail(usage, context_length), param="input", code=CODE)
