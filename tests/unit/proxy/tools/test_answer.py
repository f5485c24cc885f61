"""proxy/tools/answer.py with a tokenizer only: a request's answer planned (its grammar compiled
for the vocabulary) and read back, no model loaded."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.anthropic.protocol import MessagesRequest
from proxy.anthropic.tools import content, echoed_arguments
from proxy.anthropic.turns import template_messages
from proxy.http.errors import OpenAIError
from proxy.serving.facts import ModelFacts
from proxy.tools.answer import plan_answer
from proxy.tools.prompt import tool_messages
from proxy.tools.spec import EMPTY_PARAMETERS, Tool, ToolSet

USER = [{"role": "user", "content": "The weather in Lisbon?"}]
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


LENIENT_KEYWORDS = {
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
    "not": {"type": "string", "not": {"const": "x"}},
    "uniqueItems": {"type": "array", "uniqueItems": True},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "unevaluatedProperties": {"type": "object", "unevaluatedProperties": False},
}


@pytest.mark.parametrize("keyword", sorted(LENIENT_KEYWORDS))
def test_a_keyword_llguidance_lacks_is_left_out_of_a_non_strict_tool(
    tokenizer: Any, facts: ModelFacts, keyword: str
) -> None:
    """A tool that is not strict gets a grammar without the keyword, and one warning naming its
    schema field, the tool and the keyword; the same tool strict is a 400 naming the keyword."""
    schema = {"type": "object", "properties": {"p": LENIENT_KEYWORDS[keyword]}}
    loose = Tool("pick", "", schema)
    plan = plan_answer(
        tokenizer, facts.vocab_size, ToolSet((loose,), "required"), None, "", "tools[{i}].input_schema"
    )
    assert plan.grammar is not None
    assert plan.warnings == (
        f'tools[0].input_schema (tool "pick"): schema keyword "{keyword}" is not enforced',
    )
    with pytest.raises(OpenAIError) as refused:
        strict = Tool("pick", "", schema, strict=True)
        plan_answer(tokenizer, facts.vocab_size, ToolSet((strict,)), None, "", "tools[{i}].input_schema")
    assert refused.value.param == "tools[0].input_schema" and keyword in refused.value.message


def test_every_tool_names_its_own_keywords_once(tokenizer: Any, facts: ModelFacts) -> None:
    """Two tools, one with two keywords (one of them twice) and an unknown format, one clean:
    a warning per tool and keyword, in order, none for the clean tool."""
    twice = {"type": "object", "properties": {"a": {"not": {"type": "null"}}, "b": {"not": {"type": "null"}}}}
    twice["properties"]["c"] = {"type": "string", "format": "color", "uniqueItems": True}
    plan = plan_answer(
        tokenizer,
        facts.vocab_size,
        ToolSet((WEATHER, Tool("odd", "", twice))),
        None,
        "",
        "tools[{i}].parameters",
    )
    named = [w.split("schema keyword ")[1] for w in plan.warnings]
    assert all(w.startswith('tools[1].parameters (tool "odd")') for w in plan.warnings)
    assert sorted(named) == sorted(
        ['"not" is not enforced', '"format: color" is not enforced', '"uniqueItems" is not enforced']
    )


def test_a_relaxed_one_of_is_said_in_llguidances_words(tokenizer: Any, facts: ModelFacts) -> None:
    """A ``oneOf`` llguidance cannot prove exclusive (before: a 400) is taken as ``anyOf`` for a
    tool that is not strict, and the warning quotes llguidance on it."""
    choice = {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}
    tool = Tool("pick", "", {"type": "object", "properties": {"p": choice}})
    plan = plan_answer(tokenizer, facts.vocab_size, ToolSet((tool,)), None, "", "tools[{i}]")
    assert plan.grammar is not None and len(plan.warnings) == 1
    assert plan.warnings[0].startswith('tools[0] (tool "pick"): "oneOf not fully supported')


@pytest.mark.parametrize(
    "arguments",
    ['{"city": "Lisb\\u00f3n"}', '{"city": "Porto", "city": "Faro"}', '{"city": "a\\/b"}'],
    ids=["escape", "repeated key", "escaped slash"],
)
@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_an_answer_is_rendered_ahead_as_the_next_history_holds_it(
    tokenizer: Any, facts: ModelFacts, arguments: str, dialect: str
) -> None:
    """The model's text of a call can differ from the call as the client sends it back (an
    escape, a repeated key): ``history_message`` is the assistant message the next request's
    history renders (Claude's ``tool_use`` input serialized again; an OpenAI client's arguments
    as returned, the model's text), so render-ahead stores the tokens the next prompt holds."""
    tools = ToolSet((WEATHER,))
    plan = plan_answer(tokenizer, facts.vocab_size, tools, None, "", "tools[{i}]", "toolu_")
    raw = f'{{"tool_calls": [{{"name": "weather", "arguments": {arguments}}}]}}'
    _, calls = plan.read(raw)
    if dialect == "anthropic":
        said = plan.history_message(raw, echoed_arguments)
        body = MessagesRequest.model_validate(
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [*USER, {"role": "assistant", "content": content("", calls)}],
            }
        )
        history, _ = template_messages(body)
    else:
        said = plan.history_message(raw)
        history = [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [c.as_openai() for c in calls]},
        ]
    rendered, _ = tool_messages(history, tools, plan.format)
    assert said == rendered[-1]
    assert (said["content"] != raw) == (dialect == "anthropic")  # NOTE: OpenAI's are returned as written
