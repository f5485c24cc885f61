"""Google's words for a request over the model's context (``ContextExceeded``), as the hosted
Gemini API words them: 400 ``INVALID_ARGUMENT`` with

- ``The input token count ({prompt}) exceeds the maximum number of tokens allowed ({most}).``
  when the contents alone do not fit (``generateContent``, ``streamGenerateContent`` and
  ``cachedContents``);
- ``Unable to submit request because it has a maxOutputTokens value of {asked} but the supported
  range is from 1 (inclusive) to {end} (exclusive). Update the value and try again.`` when the
  contents fit but not with ``generationConfig.maxOutputTokens``: here the range is what the
  context leaves after this prompt.

The message goes out as is, never prefixed with a field name (Google's errors name none).
Source: the hosted API's errors as quoted in clients' issue trackers (Gemini CLI's among them)."""

from __future__ import annotations

from proxy.http.errors import OpenAIError
from proxy.serving.validation import ContextExceeded


def context_error(exc: ContextExceeded) -> OpenAIError:
    """The refusal in Google's words (see the module docstring)."""
    if exc.prompt_alone or exc.max_tokens is None:
        message = (
            f"The input token count ({exc.prompt_tokens}) exceeds the maximum number of tokens "
            f"allowed ({exc.max_prompt_tokens})."
        )
    else:
        end = exc.context - exc.prompt_tokens + 1
        message = (
            f"Unable to submit request because it has a maxOutputTokens value of {exc.max_tokens} "
            f"but the supported range is from 1 (inclusive) to {end} (exclusive). Update the value "
            "and try again."
        )
    return OpenAIError(400, message, code="context_length_exceeded")
