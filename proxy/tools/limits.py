"""Bounds on the tools and JSON Schemas one request may send, checked before anything else reads
them, so the work a request's schemas cause (canonical keys, closed objects, control-token
checks, rendering, grammar compiles) is linear in their size and bounded.

The numbers follow OpenAI's documented limits (function calling: at most 128 tools; structured
outputs' "Supported schemas": 5,000 object properties, 1,000 enum values, 120,000 characters of
property names, definition names, enum and const values). Depth is counted as JSON nesting of
the schema document, which is what a parser's recursion (Python's, and llguidance's limit of 128)
sees: 64 levels hold OpenAI's 10 levels of nested objects several times over (an object inside
``properties`` is two levels deeper, inside ``items`` one, inside ``anyOf`` two).

One ``SchemaBudget`` is shared by every schema of a request's tools, so 128 tools cannot hold 128
times the limits; the answer's schema (``response_format``) has a budget of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from proxy.http.errors import OpenAIError

MAX_TOOLS = 128
"""Tools one request may define (OpenAI's limit)."""
MAX_SCHEMA_DEPTH = 64
"""How deep a schema document may nest (objects and arrays; the schema itself is level 1)."""
MAX_PROPERTIES = 5_000
"""Object properties, counted over all the schemas of a budget."""
MAX_ENUM_VALUES = 1_000
"""``enum`` values, counted over all the schemas of a budget."""
MAX_NAME_CHARS = 120_000
"""Characters of property names, ``$defs``/``definitions`` names, ``enum``/``const`` strings and
``pattern``s, over all the schemas of a budget."""
MAX_SCHEMA_NODES = 100_000
"""Values (objects, arrays, strings, numbers, ...) in all the schemas of a budget: what bounds a
schema wide in ways the counts above miss (``anyOf`` of thousands of schemas, long ``required``)."""

_NAMED = ("properties", "$defs", "definitions")
"""Keys whose object maps names to schemas: the names are counted as characters."""


@dataclass
class SchemaBudget:
    """What the schemas of one request have used so far (``check`` adds each schema's counts)."""

    properties: int = 0
    enum_values: int = 0
    chars: int = 0
    nodes: int = 0

    def check(self, schema: Any, param: str) -> None:
        """Walk ``schema`` once (iteratively: no recursion, however deep the input) and add its
        counts, stopping at the first limit it passes.

        Raises:
            OpenAIError: 400 naming ``param`` (where the schema is in the body) and the limit.
        """
        stack: list[tuple[Any, int]] = [(schema, 1)]
        while stack:
            value, depth = stack.pop()
            self.nodes += 1
            if self.nodes > MAX_SCHEMA_NODES:
                _over(param, f"hold at most {MAX_SCHEMA_NODES} values")
            if isinstance(value, dict | list) and depth > MAX_SCHEMA_DEPTH:
                _over(param, f"nest at most {MAX_SCHEMA_DEPTH} levels deep")
            if isinstance(value, list):
                stack.extend((v, depth + 1) for v in value)
            elif isinstance(value, dict):
                self._count(value, param)
                stack.extend((v, depth + 1) for v in value.values())

    def _count(self, schema: dict[str, Any], param: str) -> None:
        for key in _NAMED:
            if isinstance(names := schema.get(key), dict):
                self.chars += sum(len(str(name)) for name in names)
                if key == "properties":
                    self.properties += len(names)
        if isinstance(values := schema.get("enum"), list):
            self.enum_values += len(values)
            self.chars += sum(len(v) for v in values if isinstance(v, str))
        for key in ("const", "pattern"):
            if isinstance(text := schema.get(key), str):
                self.chars += len(text)
        if self.properties > MAX_PROPERTIES:
            _over(param, f"hold at most {MAX_PROPERTIES} object properties")
        if self.enum_values > MAX_ENUM_VALUES:
            _over(param, f"hold at most {MAX_ENUM_VALUES} enum values")
        if self.chars > MAX_NAME_CHARS:
            _over(param, f"hold at most {MAX_NAME_CHARS} characters of names, enum and const values")


def _over(param: str, what: str) -> NoReturn:
    raise OpenAIError(400, f"schema too large: a request's schemas {what}", param=param)


def nested_within(value: Any, levels: int = MAX_SCHEMA_DEPTH) -> bool:
    """Whether JSON data ``value`` nests at most ``levels`` deep (iteratively: a value past
    Python's recursion limit is just too deep)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > levels:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def check_tool_count(tools: Any, param: str = "tools") -> None:
    """Raises OpenAIError (400 naming ``param``) for a list of more than ``MAX_TOOLS`` tools."""
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise OpenAIError(400, f"a request defines at most {MAX_TOOLS} tools, not {len(tools)}", param=param)
