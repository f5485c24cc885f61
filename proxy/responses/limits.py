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
hosted API's errors and events as quoted in clients' issue trackers and Codex's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from proxy.http.errors import OpenAIError
from proxy.responses.events import ResponseEvents
from proxy.responses.replies import ResponseError, ResponseObject
from proxy.serving.validation import ContextExceeded


def context_error(exc: ContextExceeded) -> OpenAIError:
    """The refusal as the Responses API words it (see the module docstring)."""
    n, context = exc.prompt_tokens, exc.context
    if exc.prompt_alone or exc.max_tokens is None:
        message = (
            "Your input exceeds the context window of this model. Please adjust your input and try "
            f"again. (input: {n} tokens; context window: {context} tokens, at least 1 of them for "
            "the output)"
        )
        return OpenAIError(400, message, param="input", code="context_length_exceeded")
    message = (
        "Your input and max_output_tokens exceed the context window of this model: "
        f"{n} input tokens + {exc.max_tokens} > {context}. Please lower max_output_tokens or adjust "
        "your input and try again."
    )
    return OpenAIError(400, message, param="max_output_tokens", code="context_length_exceeded")


def refused_stream(response: ResponseObject, error: OpenAIError) -> StreamingResponse:
    """A streamed request's refusal (``error``, from ``context_error``): ``response`` (the
    skeleton) created, in progress, then the ``error`` event and ``response.failed``."""
    return StreamingResponse(_refused_events(response, error), media_type="text/event-stream")


async def _refused_events(response: ResponseObject, error: OpenAIError) -> AsyncIterator[str]:
    writer = ResponseEvents()
    yield writer.event("response.created", response=response)
    yield writer.event("response.in_progress", response=response)
    fields = {"code": error.code, "message": error.message, "param": error.param}
    # NOTE: the reference documents the error event's fields flat; the hosted API has been seen
    # sending them under ``error`` (which the openai SDKs raise as an APIError): both are here
    yield writer.event("error", **fields, error={"type": error.type, **fields})
    failure: ResponseError = {"code": error.code or "", "message": error.message}
    yield writer.event("response.failed", response=response | {"status": "failed", "error": failure})
