"""The extension field ``cached_content`` (``cachedContents/{id}``, as Gemini's requests name one)
by which an OpenAI chat or an Anthropic Messages body names a named cache; each dialect puts the
cache's messages before its body's (``proxy.openai.named``, ``proxy.anthropic.named``), and the
routes that cannot start from one refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from proxy.http.errors import OpenAIError

FIELD = "cached_content"


def cache_name(extra: Mapping[str, object] | None) -> str | None:
    """The ``cached_content`` among a body's extra fields, if any.

    Raises:
        OpenAIError: 400 when it is not a string.
    """
    name = (extra or {}).get(FIELD)
    if name is not None and not isinstance(name, str):
        raise OpenAIError(400, "cached_content: must be a string such as 'cachedContents/…'", param=FIELD)
    return name


def refuse_cached_content(body: BaseModel) -> None:
    """Raises OpenAIError: 400 when a body of a route that cannot start from a named cache
    (completions, the Responses API, ``/tokenize``) names one, rather than ignore it."""
    if (body.model_extra or {}).get(FIELD) is not None:
        raise OpenAIError(
            400,
            "cached_content is taken by /v1/chat/completions, /v1/messages and Gemini's routes only",
            param=FIELD,
        )


def recorded_model(model: str, name: str, served_names: Sequence[str]) -> str:
    """A body's ``model`` as named caches record it: an alias of the served model (one of
    ``served_names``) as its ``name``."""
    return name if model in served_names else model
