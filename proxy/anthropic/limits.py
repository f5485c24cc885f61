"""Anthropic's words for a request over the model's context (``ContextExceeded``), as the hosted
Messages API words them: 400 ``invalid_request_error`` with

- ``prompt is too long: {prompt} tokens > {most} maximum`` when the prompt alone does not fit;
- ``input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {context},
  decrease input length or `max_tokens` and try again`` when the prompt fits but not with
  ``max_tokens``.

Clients act on these texts, not on a code: Claude Code retries the second with ``max_tokens``
lowered to what the context leaves (it reads the three numbers) and compacts the conversation
on the first. So the message goes out as is, never prefixed with a field name (Anthropic's
errors name none). Source: the hosted API's errors as quoted in clients' issue trackers, and the
patterns Claude Code's package applies to them."""

from __future__ import annotations

from proxy.http.errors import OpenAIError
from proxy.serving.validation import ContextExceeded


def context_error(exc: ContextExceeded) -> OpenAIError:
    """The refusal in Anthropic's words (see the module docstring)."""
    if exc.prompt_alone or exc.max_tokens is None:
        message = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.max_prompt_tokens} maximum"
    else:
        message = (
            f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + "
            f"{exc.max_tokens} > {exc.context}, decrease input length or `max_tokens` and try again"
        )
    return OpenAIError(400, message, code="context_length_exceeded")
