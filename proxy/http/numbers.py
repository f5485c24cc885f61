"""Numbers read from request text: query parameters (``pageSize``, ``pageToken``), headers, and
strings in a body that stand for numbers (``logit_bias`` keys, Gemini's int64 fields and
durations).

Only ASCII digits, and few of them: ``str.isdigit`` also accepts superscripts (``"²"``, which
``int`` refuses) and other scripts' digits (``"١٢"``, which ``int`` reads as 12), and ``int``
refuses more than 4300 digits (``sys.get_int_max_str_digits``), so each of these was a 500 or a
number the client never wrote. Here each is a 400 naming the field, in the route's dialect (the
error handlers shape ``OpenAIError``).
"""

from __future__ import annotations

import re

from proxy.http.errors import OpenAIError

MOST_DIGITS = 18
"""The longest number read from request text: 18 digits stay below 2**63 (an int64's range, the
widest any API here takes)."""

_COUNT = re.compile(rf"[0-9]{{1,{MOST_DIGITS}}}")


def is_count(text: str) -> bool:
    """Whether ``text`` is a count this server reads: 1 to ``MOST_DIGITS`` ASCII digits, no sign,
    no spaces, no separators."""
    return _COUNT.fullmatch(text) is not None


def count(text: str, param: str, lowest: int = 0, highest: int | None = None, what: str = "") -> int:
    """``text`` as an integer in ``[lowest, highest]``.

    Args:
        text: the raw value (e.g. a query parameter).
        param: the field it came from, named in the error.
        what: the error's message (default: what the field takes).

    Raises:
        OpenAIError: 400 when ``text`` is not ``is_count`` or is out of range.
    """
    bounds = f"between {lowest} and {highest}" if highest is not None else f"at least {lowest}"
    message = what or f"an integer {bounds}, in ASCII digits"
    if not is_count(text):
        raise OpenAIError(400, f"{param}: {message}", param=param)
    value = int(text)
    if value < lowest or (highest is not None and value > highest):
        raise OpenAIError(400, f"{param}: {message}", param=param)
    return value


def page_bounds(token: str, size: str, most: int) -> tuple[int, int]:
    """``(start, size)`` of a Gemini listing's page: ``pageToken`` is an offset this server gave
    (``""``: the first page), ``pageSize`` at most ``most``.

    Raises:
        OpenAIError: 400 naming ``pageToken`` or ``pageSize``.
    """
    start = count(token, "pageToken", what="not a token this server gave") if token else 0
    return start, count(size, "pageSize", 1, most)
