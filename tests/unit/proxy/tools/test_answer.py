"""proxy/tools/answer.py with a tokenizer only: a request's answer planned (its grammar compiled
for the vocabulary) and read back, no model loaded."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.http.errors import OpenAIError
from proxy.serving.facts import ModelFacts
from proxy.tools.answer import plan_answer
from proxy.tools.spec import EMPTY_PARAMETERS, Tool, ToolSet

WEATHER = Tool(
    "weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}}
)


def test_a_tool_answer_is_planned_and_read(tokenizer: Any, facts: ModelFacts) -> None:
    """Tools give a grammar; an answer in the format's words is read as calls, their ids made
    with the dialect's prefix."""
    plan = plan_answer(
        tokenizer, facts.vocab_size, ToolSet((WEATHER,)), None, "", "tools[{i}].input_schema", "toolu_"
    )
    assert plan.grammar is not None and plan.reads_calls
    text, calls = plan.read('{"tool_calls": [{"name": "weather", "arguments": {"city": "Lisbon"}}]}')
    assert text == ""
    assert [(c.name, c.arguments) for c in calls] == [("weather", '{"city": "Lisbon"}')]
    assert calls[0].id.startswith("toolu_")


def test_free_text_has_no_grammar(tokenizer: Any, facts: ModelFacts) -> None:
    """Without tools or a schema the answer is free text, read as it is."""
    plan = plan_answer(tokenizer, facts.vocab_size, None, None, "schema", "tools[{i}]")
    assert plan.grammar is None and plan.read("hello") == ("hello", [])


def test_a_schema_asking_for_a_control_token_is_refused(tokenizer: Any, facts: ModelFacts) -> None:
    """No answer can write a control token as text: such a tool schema is a 400 naming the tool."""
    bad = Tool("f", "", EMPTY_PARAMETERS | {"properties": {"<|im_end|>": {"type": "string"}}})
    with pytest.raises(OpenAIError) as refused:
        plan_answer(tokenizer, facts.vocab_size, ToolSet((WEATHER, bad)), None, "", "tools[{i}].input_schema")
    assert refused.value.param == "tools[1].input_schema"
