"""Reading JSON that is still being written: where a value ends, and a string's text so far.

Constrained answers arrive token by token; streaming them means reading a prefix of the JSON the
grammar will complete. These helpers never guess: a value whose end has not arrived is open.
"""

from __future__ import annotations

import json

_ESCAPE_LENGTH = {"u": 6}  # \uXXXX; every other escape is two characters


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at ``text[start]``, or None while it is
    still open (an object, array or string not yet closed; a number or literal at the end)."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            end = string_end(text, i)
            if end is None:
                return None
            if depth == 0:
                return end
            i = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return i  # a bare number or literal closed by its container
        elif c == "," and depth == 0:
            return i
        i += 1
    return None


def string_end(text: str, start: int) -> int | None:
    """The index just past the JSON string opening at ``text[start]``, or None while open."""
    i, n = start + 1, len(text)
    while i < n:
        if text[i] == "\\":
            i += _ESCAPE_LENGTH.get(text[i + 1] if i + 1 < n else "", 2)
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return None


def string_prefix(text: str, start: int) -> str:
    """The decoded characters of the JSON string opening at ``text[start]`` that have arrived
    (an escape sequence only once it is whole)."""
    i, n, body_end = start + 1, len(text), start + 1
    while i < n:
        if text[i] == "\\":
            step = _ESCAPE_LENGTH.get(text[i + 1] if i + 1 < n else "", 2)
            if i + step > n:
                break
            i += step
        elif text[i] == '"':
            break
        else:
            i += 1
        body_end = i
    decoded = str(json.loads('"' + text[start + 1 : body_end] + '"'))
    # NOTE: a surrogate pair's first half waits for its second (alone it is not a character)
    return decoded[:-1] if decoded and "\ud800" <= decoded[-1] <= "\udbff" else decoded
