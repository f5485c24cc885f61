"""``proxy.anthropic.thinking``: the Messages API's reasoning settings checked as the hosted API
checks them; every accepted shape is satisfied by an answer without thinking."""

from __future__ import annotations

import pytest

from proxy.anthropic.thinking import reasoning_error


@pytest.mark.parametrize(
    ("thinking", "output_config", "max_tokens"),
    [
        (None, None, 16),
        ({"type": "adaptive"}, None, 16),
        ({"type": "adaptive", "display": "summarized"}, {"effort": "xhigh"}, 16),
        ({"type": "disabled"}, {}, 16),
        ({"type": "between_tools"}, None, 16),
        ({"type": "enabled", "budget_tokens": 1024}, None, 1025),
        ({"type": "enabled", "budget_tokens": 32000, "display": "omitted"}, None, None),  # count_tokens
    ],
)
def test_accepted_shapes(thinking, output_config, max_tokens) -> None:
    """Claude Code's default (adaptive), a budget of at least 1,024 below ``max_tokens`` (none
    to compare with on ``count_tokens``), every effort and display are accepted."""
    assert reasoning_error(thinking, output_config, max_tokens) is None


@pytest.mark.parametrize(
    ("thinking", "output_config", "max_tokens", "param"),
    [
        ({"type": "always"}, None, 16, "thinking.type"),
        ({}, None, 16, "thinking.type"),
        ([], None, 16, "thinking"),
        ({"type": "adaptive", "display": "verbose"}, None, 16, "thinking.display"),
        ({"type": "enabled"}, None, 4096, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 1023}, None, 4096, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": True}, None, 4096, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 1024.0}, None, 4096, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 4096}, None, 4096, "max_tokens"),
        (None, {"effort": "maximum"}, 16, "output_config.effort"),
        (None, "high", 16, "output_config"),
    ],
)
def test_refused_shapes_name_the_field(thinking, output_config, max_tokens, param) -> None:
    """An unknown type or display, a missing, non-integer, too small or not-below-``max_tokens``
    budget, an unknown effort: the field named, as the hosted API's 400 names it."""
    refused = reasoning_error(thinking, output_config, max_tokens)
    assert refused is not None and refused[0] == param
    assert param.split(".")[-1] in refused[1]
