"""An answer the model's context window ended, reported as the hosted API reports a conversation
grown past the window, so that agents recover (compact their history and go on).

A request that sets no ``max_output_tokens`` asks for an answer up to the context; when the
window, not the server's ``--default-max-tokens``, ends it, the conversation no longer fits:
Codex compacts on the error code ``context_length_exceeded`` (a streamed ``response.failed``
whose ``response.error.code`` it is: openai/codex, ``codex-api`` SSE handling; the stream's
events, ``proxy.responses.events``) and fails the turn on ``response.incomplete``. A request
that sets ``max_output_tokens`` asked for that many tokens at most; running out of them stays
``incomplete`` (``max_output_tokens``).
"""

from __future__ import annotations

from engine.requests import Finished
from proxy.http.errors import OpenAIError
from proxy.responses.replies import ResponseError
from proxy.serving.turn import Usage

CODE = "context_length_exceeded"
MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."
"""The hosted API's words for it (clients match the code; some the words)."""


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
