"""What a turn may ask of this server, turned into the engine's ``GenerationRequest``: the model,
the prompt's length against the context, the sampling parameters and the TTL policy. Every
refusal is an OpenAI-shaped error naming the field."""

from __future__ import annotations

from collections.abc import Mapping

from engine.requests import GenerationRequest
from engine.sampling import SamplingParams
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.http.numbers import is_count
from proxy.serving.facts import ModelFacts
from proxy.serving.turn import Sampling, Turn
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


def check_prompt_length(facts: ModelFacts, n: int, param: str) -> None:
    """400 ``context_length_exceeded`` naming ``param`` unless an ``n``-token prompt leaves room
    for at least one generated token."""
    context = facts.context_length
    if n >= context:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt alone has {n}.",
            param=param,
            code="context_length_exceeded",
        )


def completion_budget(
    facts: ModelFacts, settings: Settings, n: int, max_tokens: int | None, prompt_param: str = "prompt"
) -> int:
    """Tokens the completion may have: ``max_tokens``, or up to the context bounded by
    ``--default-max-tokens`` when absent (OpenAI's "up to the context").

    Raises:
        OpenAIError: empty prompt, or prompt + max_tokens over the model's context (400).
    """
    if n == 0:
        raise OpenAIError(400, "the prompt is empty", param="prompt")
    check_prompt_length(facts, n, prompt_param)
    context = facts.context_length
    if max_tokens is None:
        return min(context - n, settings.default_max_tokens)
    if n + max_tokens > context:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt has {n} tokens "
            f"and {max_tokens} were requested for the completion.",
            param="max_tokens",
            code="context_length_exceeded",
        )
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


def sampling_params(sampling: Sampling, vocab_size: int) -> SamplingParams:
    """The engine's sampling parameters: OpenAI's defaults for the fields not given (temperature
    and top_p 1, no seed, no penalties, no bias).

    Raises:
        ValueError: a ``logit_bias`` key outside the vocabulary (``token_bias``).
    """
    bias = token_bias(sampling.logit_bias, vocab_size)
    return SamplingParams(
        temperature=1.0 if sampling.temperature is None else sampling.temperature,
        top_p=1.0 if sampling.top_p is None else sampling.top_p,
        seed=sampling.seed,
        presence_penalty=sampling.presence_penalty or 0.0,
        frequency_penalty=sampling.frequency_penalty or 0.0,
        logit_bias=tuple(bias.items()),
    )


def generation_request(
    facts: ModelFacts, settings: Settings, turn: Turn, prompt_ids: list[int], ttl: TtlPlan
) -> GenerationRequest:
    """Check the prompt's length against the context and build the engine's request for ``turn``
    (its blocks kept as ``ttl`` plans).

    Raises:
        OpenAIError: see ``completion_budget``; a ``logit_bias`` key outside the vocabulary (400).
    """
    budget = completion_budget(facts, settings, len(prompt_ids), turn.max_tokens, turn.params.prompt)
    try:
        sampling = sampling_params(turn.sampling, facts.vocab_size)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="logit_bias") from exc
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        max_tokens=budget,
        sampling=sampling,
        stop=turn.stop,
        top_logprobs=turn.top_logprobs,
        tenant=turn.tenant,
        cache_ttl_s=ttl,
    )
