"""The Messages API's reasoning settings, ``thinking`` and ``output_config.effort``, on a model
that does not reason: checked as the hosted API checks their shapes, then satisfied by an answer
without thinking blocks.

``{"type": "adaptive"}`` lets the model decide whether to think, and ``{"type": "enabled",
"budget_tokens": N}`` sets the most it may think: an answer with no thinking is within both, as
``{"type": "disabled"}`` asks outright. The effort is how much the model puts into its answer;
kvproxy's model has one way of answering, so every level is answered the same.

Source: Anthropic's API reference, Messages (``thinking``: ``enabled`` with a ``budget_tokens`` of
at least 1,024 and below ``max_tokens``, ``disabled``, ``adaptive``, ``between_tools``, each with
an optional ``display`` of ``summarized`` or ``omitted``; ``output_config.effort``: ``low``,
``medium``, ``high``, ``xhigh`` or ``max``) and Extended thinking (the thinking blocks of earlier
assistant turns are not part of the model's context: a history's ``thinking`` and
``redacted_thinking`` blocks are accepted and not rendered, ``proxy.anthropic.turns``).
"""

from __future__ import annotations

from typing import Any

THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
"""The ``thinking.type`` values the Messages API takes."""
DISPLAYS = ("summarized", "omitted")
"""The ``thinking.display`` values."""
MIN_BUDGET_TOKENS = 1024
"""The least ``thinking.budget_tokens``."""
EFFORTS = ("low", "medium", "high", "xhigh", "max")
"""The ``output_config.effort`` values."""


def reasoning_error(thinking: Any, output_config: Any, max_tokens: int | None) -> tuple[str, str] | None:
    """``(param, message)`` for the first way ``thinking`` or ``output_config`` (a body's fields,
    None when absent) breaks the Messages API's rules, if any; ``max_tokens`` None: a body
    without one (``count_tokens``), whose budget is not compared."""
    if thinking is not None:
        if not isinstance(thinking, dict):
            return "thinking", "thinking: Input should be an object"
        kind = thinking.get("type")
        if kind not in THINKING_TYPES:
            expected = ", ".join(f"'{t}'" for t in THINKING_TYPES)
            return "thinking.type", f"thinking.type: Input should be {expected} (got {_shown(kind)})"
        display = thinking.get("display")
        if display is not None and display not in DISPLAYS:
            expected = " or ".join(f"'{d}'" for d in DISPLAYS)
            return "thinking.display", f"thinking.display: Input should be {expected}"
        if kind == "enabled" and (broken := _budget_error(thinking.get("budget_tokens"), max_tokens)):
            return broken
    if output_config is not None:
        if not isinstance(output_config, dict):
            return "output_config", "output_config: Input should be an object"
        effort = output_config.get("effort")
        if effort is not None and effort not in EFFORTS:
            expected = ", ".join(f"'{e}'" for e in EFFORTS)
            return "output_config.effort", f"output_config.effort: Input should be {expected}"
    return None


def _budget_error(budget: Any, max_tokens: int | None) -> tuple[str, str] | None:
    """An ``enabled`` thinking's ``budget_tokens``: an integer of at least ``MIN_BUDGET_TOKENS``,
    below ``max_tokens``."""
    param = "thinking.budget_tokens"
    if budget is None:
        return param, f"{param}: Field required"
    if isinstance(budget, bool) or not isinstance(budget, int):
        return param, f"{param}: Input should be a valid integer"
    if budget < MIN_BUDGET_TOKENS:
        return param, f"{param}: Input should be greater than or equal to {MIN_BUDGET_TOKENS}"
    if max_tokens is not None and max_tokens <= budget:
        return "max_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`"
    return None


def _shown(value: Any) -> str:
    """A request's value as an error message quotes it (its type when it is not a string)."""
    return repr(value[:64]) if isinstance(value, str) else type(value).__name__
