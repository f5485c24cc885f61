"""The grammars constrained answers are decoded under (llguidance's format, ``engine.constraint``).

Every JSON value is written compactly on one line with ``", "`` and ``": "`` separators (the form
``proxy.tools.spec.dumps`` writes): no free whitespace for a model to loop in, and an answer the
prompt of the next turn shows token for token as it was generated.

Source: llguidance's grammar syntax (Lark with ``%json{schema}`` embedded) and its JSON Schema
support (guidance-ai/llguidance, docs/syntax.md and docs/json_schema.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance

from proxy.tools.spec import Tool, dumps

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options: compact, with the separators of ``json.dumps``."""


def options(lenient: bool) -> dict[str, Any]:
    """The JSON options of a schema; ``lenient``: the keywords and formats llguidance does not
    implement (``propertyNames``, ``not``, ``if``, ``uniqueItems``, ...) are left out of the
    grammar, with a warning each, instead of failing it.

    NOTE: a JSON Schema's keywords each narrow what is valid, so leaving one out only widens the
    grammar: every value the schema accepts is still accepted; what the keyword would have
    refused may be written too."""
    return JSON_OPTIONS | {"lenient": True} if lenient else JSON_OPTIONS


def json_grammar(schema: dict[str, Any], lenient: bool = False) -> str:
    """A whole answer that is one JSON value of ``schema`` (``lenient``: see ``options``)."""
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=options(lenient))  # type: ignore[arg-type]


def embedded(schema: dict[str, Any], lenient: bool = False) -> str:
    """``schema`` as a Lark ``%json`` item, with the compact options (``lenient``: see ``options``)."""
    return "%json " + json.dumps(schema | {"x-guidance": options(lenient)})


def closed(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` on every object schema that lists its
    ``properties`` and says nothing of others: the grammar of a call's arguments (and of a
    ``strict`` answer, as OpenAI's structured outputs define it) writes only the named ones, so a
    model cannot invent a parameter the function does not take."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    named = isinstance(schema.get("properties"), dict)
    # NOTE: each property's schema is closed once (the names' map itself is not a schema): an
    # object nested n deep costs n steps, not 2**n
    out = {
        k: {name: closed(s) for name, s in v.items()} if k == "properties" and named else closed(v)
        for k, v in schema.items()
    }
    if named:
        out.setdefault("additionalProperties", False)
    return out


def special_literal(schema: Any, specials: set[str]) -> str | None:
    """The first special-token string (``<|im_end|>``, ...) ``schema`` would make an answer
    write: in a property name, a ``const``, an ``enum`` value or a ``pattern``. The model writes
    those strings only as control tokens, never as text, so no answer could follow it."""
    if isinstance(schema, list):
        return next((hit for s in schema if (hit := special_literal(s, specials))), None)
    if not isinstance(schema, dict):
        return None
    texts = list(schema["properties"]) if isinstance(schema.get("properties"), dict) else []
    texts += [schema.get("const"), re.sub(r"\\(.)", r"\1", str(schema.get("pattern") or ""))]
    texts += schema["enum"] if isinstance(schema.get("enum"), list) else []
    for text in texts:
        if isinstance(text, str) and (hit := next((s for s in specials if s in text), None)):
            return hit
    return next((hit for v in schema.values() if (hit := special_literal(v, specials))), None)


def literal(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text)


def call_rules(tools: tuple[Tool, ...], arguments_key: str = "arguments") -> str:
    """Lark rules: ``call`` is ``{"name": "<a tool>", "<arguments_key>": <its arguments>}`` (a
    tool's arguments lenient unless it is ``strict``: ``options``)."""
    rules = [f"call: {' | '.join(f'call_{i}' for i in range(len(tools)))}"]
    for i, tool in enumerate(tools):
        head = dumps({"name": tool.name})[:-1] + f', "{arguments_key}": '
        rules.append(
            f"call_{i}: {literal(head)} {embedded(closed(tool.parameters), not tool.strict)} {literal('}')}"
        )
    return "\n".join(rules)


def lark_grammar(rules: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark(rules)
