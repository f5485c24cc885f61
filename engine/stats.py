"""``EngineStats``: an engine's token and step counters (``engine.runner.Runner.stats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Token counters of an engine: every fed token is counted once, so prefill_tokens +
    prewarm_tokens + decode_tokens is exactly what the model computed and kept (it also computed
    the draft tokens not accepted, draft_tokens - accepted_tokens); decode_tokens / decode_steps
    is the mean decode batch size times the tokens a draft adds. Prewarm requests count only in
    prewarm_tokens."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_steps: int = 0
    decode_step_seconds: float = 0.0
    """Seconds inside the decode steps' forward passes (not sampling, not the server around
    them): ``decode_steps / decode_step_seconds`` is the step's own rate."""
    prewarm_tokens: int = 0
    draft_tokens: int = 0
    """Tokens drafted for speculation (``engine.drafting``), fed beside the last tokens (the
    accepted ones count in decode_tokens too)."""
    accepted_tokens: int = 0
    """Of draft_tokens, those the sampled tokens confirmed: tokens decoded without a step of their own."""
