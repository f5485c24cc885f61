"""``x-kvproxy-warning``: what the server did with a request other than exactly what it asked,
while still answering it (a schema keyword its grammar leaves unenforced, a field it ignores).

One header, its warnings joined by ``"; "``, each a line of ASCII (the callers quote what came
from the request). A request with many warnings gets the first ones and a count of the rest:
clients bound the size of a response's headers (Node's HTTP parser, 16 KiB in all).
"""

from __future__ import annotations

from collections.abc import Sequence

WARNING_HEADER = "x-kvproxy-warning"
MAX_WARNING_CHARS = 2048
"""The longest header value; warnings past it are counted, not written."""


def warning_headers(warnings: Sequence[str]) -> dict[str, str]:
    """``{WARNING_HEADER: "<warning>; <warning>; ..."}`` for ``warnings`` (each once, in order),
    at most ``MAX_WARNING_CHARS`` long, ending ``"; and N more"`` when some did not fit; ``{}``
    without warnings."""
    # NOTE: a header is one line of visible ASCII; callers quote request text, this keeps it so
    printable = (w.encode("ascii", "backslashreplace").decode() for w in warnings)
    unique = list(dict.fromkeys("".join(c if " " <= c <= "~" else " " for c in w) for w in printable))
    if not unique:
        return {}
    value, written = "", 0
    for warning in unique:
        joined = f"{value}; {warning}" if value else warning
        if len(joined) > MAX_WARNING_CHARS - 20 and written:  # NOTE: room for the count
            break
        value, written = joined[: MAX_WARNING_CHARS - 20], written + 1
    if written < len(unique):
        value += f"; and {len(unique) - written} more"
    return {WARNING_HEADER: value}
