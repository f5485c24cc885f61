"""OpenAI's words for a request over the model's context (``ContextExceeded``): 400
``invalid_request_error``, ``code: context_length_exceeded``, the field in ``param``, and the
hosted API's sentences, which clients match ("maximum context length is"; LiteLLM, aider) besides
the code. Chat completions count "in the messages, ... in the completion"; legacy completions
"in your prompt; ... for the completion". Source: the errors the hosted API returns, as quoted in
clients' issue trackers."""

from __future__ import annotations

from proxy.http.errors import OpenAIError
from proxy.serving.validation import ContextExceeded


def chat_context_error(exc: ContextExceeded, max_field: str = "max_tokens") -> OpenAIError:
    """A chat completion over the context, naming ``messages`` when they alone are too long, else
    ``max_field`` (the field the body set: ``max_tokens`` or ``max_completion_tokens``)."""
    context, n, asked = exc.context, exc.prompt_tokens, exc.max_tokens
    if asked is None:
        message = (
            f"This model's maximum context length is {context} tokens. However, your messages "
            f"resulted in {n} tokens. Please reduce the length of the messages."
        )
    else:
        message = (
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{n + asked} tokens ({n} in the messages, {asked} in the completion). Please reduce "
            "the length of the messages or completion."
        )
    param = "messages" if exc.prompt_alone else max_field
    return OpenAIError(400, message, param=param, code="context_length_exceeded")


def completion_context_error(exc: ContextExceeded) -> OpenAIError:
    """A legacy completion over the context, naming ``prompt`` when it alone is too long, else
    ``max_tokens``."""
    context, n, asked = exc.context, exc.prompt_tokens, exc.max_tokens
    if asked is None:
        # NOTE: the hosted API always counts a completion (its default is 16); here an absent
        # max_tokens means up to the context, so only the prompt is counted
        message = (
            f"This model's maximum context length is {context} tokens, however your prompt has {n} "
            "tokens and leaves no room for the completion. Please reduce your prompt."
        )
    else:
        message = (
            f"This model's maximum context length is {context} tokens, however you requested "
            f"{n + asked} tokens ({n} in your prompt; {asked} for the completion). Please reduce "
            "your prompt; or completion length."
        )
    param = "prompt" if exc.prompt_alone else "max_tokens"
    return OpenAIError(400, message, param=param, code="context_length_exceeded")
