"""What a turn may ask of this server: the model, the prompt's length against the context, a
``logit_bias``'s token ids, and the TTL policy. Every refusal is an OpenAI-shaped error naming
the field; a request over the context is a ``ContextExceeded`` carrying its numbers, which each
dialect words as its hosted API does. Nothing here loads torch (the router may check as a
replica does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.http.numbers import is_count
from proxy.serving.facts import ModelFacts

if TYPE_CHECKING:  # NOTE: store.interface loads torch
    from store.interface import TtlPlan

RETENTION_S = {"24h": 86_400}
"""OpenAI's ``prompt_cache_retention`` values in seconds (``"in_memory"``: the server's TTL)."""


def check_model(facts: ModelFacts, name: str) -> None:
    """Raises a 404 ``model_not_found`` unless ``name`` is one of the served model's names."""
    if name not in facts.served_names:
        served = "', '".join(facts.served_names)
        raise OpenAIError(
            404,
            f"The model '{name}' does not exist; this server serves '{served}'",
            param="model",
            code="model_not_found",
        )


def cache_ttl(settings: Settings, retention: str | None) -> int:
    """Seconds the blocks a request stores or hits are kept: the server's TTL (retention absent
    or ``"in_memory"``), or the requested retention capped at ``--max-ttl``."""
    return min(RETENTION_S.get(retention or "", settings.ttl), settings.max_ttl)


class ContextExceeded(OpenAIError):
    """400 ``context_length_exceeded``: a request over the model's context, with its numbers.

    The prompt alone is too long (``prompt_alone``) when it leaves no room for one generated
    token: at most ``max_prompt_tokens`` (``context - 1``) fit. Otherwise the prompt and the
    ``max_tokens`` asked (None: not given) add up to more than ``context``. Each dialect catches
    it and words it as its hosted API does, so that clients which recover from it (retry with a
    smaller ``max_tokens``, compact) recognise it; the message here is the fallback for
    kvproxy's own routes. ``param`` names the prompt's field, or the completion's when the
    prompt fits.

    Attributes:
        prompt_tokens: the prompt's length, in tokens.
        max_tokens: the completion's length asked, or None.
        context: the model's context length, in tokens.
    """

    def __init__(self, prompt_tokens: int, max_tokens: int | None, context: int, param: str) -> None:
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context
        if max_tokens is None:
            message = (
                f"the prompt has {prompt_tokens} tokens; this model's context holds {context} tokens "
                "(prompt and completion, at least one token generated)"
            )
        else:
            message = (
                f"the prompt has {prompt_tokens} tokens and {max_tokens} were asked for the completion: "
                f"{prompt_tokens + max_tokens} tokens, over this model's context of {context} tokens"
            )
        super().__init__(400, message, param=param, code="context_length_exceeded")

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt that fits: the context less one generated token."""
        return self.context - 1

    @property
    def prompt_alone(self) -> bool:
        """Whether the prompt alone is over ``max_prompt_tokens`` (else with ``max_tokens``)."""
        return self.prompt_tokens > self.max_prompt_tokens


def kept_ttl(settings: Settings, asked: TtlPlan) -> TtlPlan:
    """The TTL plan a turn's blocks are kept under, given the plan its client asked (``Turn.ttl``
    or its cache marks, each capped at ``--max-ttl``; None: the server's ``--ttl``).

    ``--client-ttl floor`` (the default): a client's TTL lengthens retention but never shortens
    it below the server's ``--ttl``. NOTE: a hosted API's TTL bounds what the client pays for;
    on a local server a shorter TTL would only free memory early, and lose a session resumed
    after a pause (Claude Code marks its breakpoints with the 5-minute default).
    ``--client-ttl exact``: as asked, as the hosted APIs expire it.
    """
    if settings.client_ttl == "exact" or asked is None:
        return asked
    floor = min(settings.ttl, settings.max_ttl)
    if isinstance(asked, int):
        return max(asked, floor)
    return tuple(None if ttl is None else max(ttl, floor) for ttl in asked)


def check_prompt_length(facts: ModelFacts, n: int, param: str) -> None:
    """Raises ``ContextExceeded`` naming ``param`` unless an ``n``-token prompt leaves room for at
    least one generated token."""
    if n >= facts.context_length:
        raise ContextExceeded(n, None, facts.context_length, param)


def completion_budget(
    facts: ModelFacts,
    settings: Settings,
    n: int,
    max_tokens: int | None,
    prompt_param: str = "prompt",
    to_window: bool = False,
) -> int:
    """Tokens the completion may have: ``max_tokens``, or up to the context when absent (OpenAI's
    "up to the context"), bounded by ``--default-max-tokens`` unless ``to_window``.

    Raises:
        OpenAIError: the prompt is empty (400).
        ContextExceeded: the prompt leaves no room for a token (naming ``prompt_param``), or
            prompt + ``max_tokens`` is over the model's context (naming ``max_tokens``).
    """
    if n == 0:
        raise OpenAIError(400, "the prompt is empty", param="prompt")
    context = facts.context_length
    if n >= context:
        raise ContextExceeded(n, max_tokens, context, prompt_param)
    if max_tokens is None:
        return context - n if to_window else min(context - n, settings.default_max_tokens)
    if n + max_tokens > context:
        raise ContextExceeded(n, max_tokens, context, "max_tokens")
    return max_tokens


def token_bias(bias: Mapping[str, float] | None, vocab_size: int) -> dict[int, float]:
    """A ``logit_bias`` object with token ids as ints.

    Raises:
        ValueError: a key is not a token id of the vocabulary.
    """
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not is_count(key) or not 0 <= int(key) < vocab_size:  # NOTE: ASCII digits only
            raise ValueError(f"logit_bias key {key[:40]!r} is not a token id in [0, {vocab_size})")
        out[int(key)] = value
    return out
