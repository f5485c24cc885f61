"""``x-kvproxy-warning`` (``proxy.http.warnings``): one header, each warning once, visible ASCII,
bounded in length with a count of what did not fit."""

from __future__ import annotations

from proxy.http.warnings import MAX_WARNING_CHARS, WARNING_HEADER, warning_headers


def test_no_warning_no_header() -> None:
    """A request that was done as asked carries no warning header."""
    assert warning_headers(()) == {}


def test_warnings_are_joined_once_each_in_order() -> None:
    """Repeated warnings are written once, in the order first given."""
    assert warning_headers(["a", "b", "a"]) == {WARNING_HEADER: "a; b"}


def test_a_warning_is_one_line_of_visible_ascii() -> None:
    """Request text in a warning (a format's name) cannot break the header: non-ASCII is
    escaped, control characters become spaces."""
    value = warning_headers(['format "bleu\u00e9\r\nx-evil: 1"'])[WARNING_HEADER]
    assert value == 'format "bleu\\xe9  x-evil: 1"'
    assert all(" " <= c <= "~" for c in value)


def test_many_warnings_are_bounded_and_counted() -> None:
    """Past ``MAX_WARNING_CHARS`` the rest are counted, not written (clients bound headers)."""
    value = warning_headers([f"tool {i}: keyword not enforced" for i in range(500)])[WARNING_HEADER]
    assert len(value) <= MAX_WARNING_CHARS
    written = value.split("; and ")[0].count("; ") + 1
    assert value.endswith(f"; and {500 - written} more")
