"""The bounds on a request's schemas and tools (``proxy.tools.limits``): each limit is a 400
naming the field, reached by one linear walk; the schema helpers stay linear within them."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.http.errors import OpenAIError
from proxy.tools import grammars, limits
from proxy.tools.limits import SchemaBudget, check_tool_count
from proxy.tools.spec import Tool, make_tool, tool_set


def nested(levels: int) -> dict[str, Any]:
    """An object schema with ``levels`` objects nested in ``properties`` (JSON depth 2n + 1)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema, "b": {"type": "integer"}}, "required": ["a"]}
    return schema


def refused(schema: Any, param: str = "tools[3].parameters", budget: SchemaBudget | None = None) -> str:
    with pytest.raises(OpenAIError) as err:
        (budget or SchemaBudget()).check(schema, param)
    assert err.value.status == 400 and err.value.param == param
    return err.value.message


def test_depth_is_json_nesting_and_the_deepest_allowed_passes() -> None:
    """A schema nested 64 levels deep passes; 65 is refused, naming the field."""
    deepest = (limits.MAX_SCHEMA_DEPTH - 1) // 2
    SchemaBudget().check(nested(deepest), "p")
    assert "64 levels" in refused(nested(deepest + 1))


def test_depth_check_never_recurses() -> None:
    """A schema nested far past Python's recursion limit is refused, not a RecursionError."""
    schema: Any = {}
    for _ in range(50_000):
        schema = {"items": schema}
    refused(schema)


@pytest.mark.parametrize(
    ("schema", "what"),
    [
        ({"type": "object", "properties": {f"p{i}": {} for i in range(5001)}}, "5000 object properties"),
        ({"enum": list(range(1001))}, "1000 enum values"),
        ({"type": "object", "properties": {"x" * 120_001: {}}}, "120000 characters"),
        ({"anyOf": [{"type": "null"}] * 60_000}, "100000 values"),
    ],
)
def test_width_limits(schema: dict[str, Any], what: str) -> None:
    """Too many properties, enum values, characters of names or values in all: 400 naming the field."""
    assert what in refused(schema)


def test_the_budget_is_shared_by_a_requests_tools() -> None:
    """Two tools of 3,000 properties each: the second passes the request's total and is named."""
    half = {"type": "object", "properties": {f"p{i}": {} for i in range(3000)}}
    budget = SchemaBudget()
    make_tool("a", None, half, "tools[0].function", budget=budget)
    with pytest.raises(OpenAIError) as err:
        make_tool("b", None, half, "tools[1].function", budget=budget)
    assert err.value.param == "tools[1].function.parameters"


def test_tool_count() -> None:
    """128 tools pass; 129 are a 400 naming ``tools``."""
    check_tool_count([{}] * limits.MAX_TOOLS)
    with pytest.raises(OpenAIError) as err:
        check_tool_count([{}] * (limits.MAX_TOOLS + 1))
    assert err.value.param == "tools" and "128" in err.value.message


def test_duplicate_names_are_found_in_a_long_list() -> None:
    """The duplicate check is a set: 200,000 tools with one repeated at the end is a 400 at once."""
    tools = [Tool(f"t{i}", "", {}) for i in range(200_000)] + [Tool("t7", "", {})]
    with pytest.raises(OpenAIError) as err:
        tool_set(tools, "auto", None, None, "tool_choice")
    assert "`t7` is defined twice" in err.value.message


def test_closed_walks_each_property_once() -> None:
    """``closed`` of an object nested 31 deep (2**31 steps before) closes every level."""
    schema = grammars.closed(nested(31))
    for _ in range(31):
        assert schema["additionalProperties"] is False
        schema = schema["properties"]["a"]
    assert schema == {"type": "string"}


def test_closed_keeps_a_property_named_properties() -> None:
    """A property called ``properties`` is a name, not a schema keyword."""
    schema = {"type": "object", "properties": {"properties": {"type": "object", "properties": {}}}}
    assert grammars.closed(schema) == {
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {}, "additionalProperties": False}},
        "additionalProperties": False,
    }
