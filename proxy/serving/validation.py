"""Request validation and the TTL policy: what a body may ask of this server, turned into the
engine's ``GenerationRequest``. Every refusal is an OpenAI-shaped error naming the field."""

from __future__ import annotations

from engine.requests import GenerationRequest
from engine.sampling import SamplingParams
from engine.worker import Engine
from proxy.config import Settings
from proxy.http.errors import OpenAIError
from proxy.openai.protocol import SamplingFields

RETENTION_S = {"24h": 86_400}
"""OpenAI's ``prompt_cache_retention`` values in seconds (``"in_memory"``: the server's TTL)."""


def check_request(engine: Engine, body: SamplingFields) -> None:
    """404 for another model, 400 naming the first field this server cannot honour."""
    check_model(engine, body.model)
    if (unsupported := body.unsupported_field()) is not None:
        param, reason = unsupported
        raise OpenAIError(400, reason, param=param, code="unsupported_parameter")


def check_model(engine: Engine, name: str) -> None:
    """Raises a 404 ``model_not_found`` unless ``name`` is one of the served model's names."""
    if name not in engine.loaded.served_names:
        served = "', '".join(engine.loaded.served_names)
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


def check_prompt_length(engine: Engine, n: int, param: str) -> None:
    """400 ``context_length_exceeded`` naming ``param`` unless an ``n``-token prompt leaves room
    for at least one generated token."""
    context = engine.loaded.context_length
    if n >= context:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt alone has {n}.",
            param=param,
            code="context_length_exceeded",
        )


def completion_budget(
    engine: Engine, settings: Settings, n: int, max_tokens: int | None, prompt_param: str = "prompt"
) -> int:
    """Tokens the completion may have: ``max_tokens``, or up to the context bounded by
    ``--default-max-tokens`` when absent (OpenAI's "up to the context").

    Raises:
        OpenAIError: empty prompt, or prompt + max_tokens over the model's context (400).
    """
    if n == 0:
        raise OpenAIError(400, "the prompt is empty", param="prompt")
    check_prompt_length(engine, n, prompt_param)
    context = engine.loaded.context_length
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


def generation_request(
    engine: Engine,
    settings: Settings,
    tenant: str,
    body: SamplingFields,
    prompt_ids: list[int],
    max_tokens: int | None,
    top_logprobs: int = 0,
) -> GenerationRequest:
    """Check lengths against the context and build the engine's request.

    Raises:
        OpenAIError: see ``completion_budget``; a ``logit_bias`` key outside the vocabulary (400).
    """
    prompt_param = "messages" if hasattr(body, "messages") else "prompt"
    budget = completion_budget(engine, settings, len(prompt_ids), max_tokens, prompt_param)
    try:
        bias = body.token_bias(engine.loaded.model.config.vocab_size)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="logit_bias") from exc
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        max_tokens=budget,
        sampling=SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            logit_bias=tuple(bias.items()),
        ),
        stop=body.stop_strings(),
        top_logprobs=top_logprobs,
        tenant=tenant,
        cache_ttl_s=cache_ttl(settings, body.prompt_cache_retention),
    )
