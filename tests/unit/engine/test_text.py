"""engine/text.py: stop strings end the text and are excluded from it; nothing is taken back."""

from __future__ import annotations

from engine.text import TextStream


class CharTokenizer:
    """One character per token id (its code point)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def feed(text: str, stop: tuple[str, ...]) -> tuple[list[str], str, bool]:
    stream = TextStream(CharTokenizer(), stop)
    deltas = []
    for ch in text:
        deltas.append(stream.push(ord(ch)))
        if stream.stopped:
            break
    deltas.append(stream.finish())
    return deltas, "".join(deltas), stream.stopped


def test_stop_string_is_cut_and_excluded() -> None:
    """The text ends right before the stop string."""
    _, text, stopped = feed("Paris is nice. END more", ("END",))
    assert (text, stopped) == ("Paris is nice. ", True)


def test_possible_stop_prefix_is_held_then_released() -> None:
    """'EN' is held while it may become 'END', and released when it does not."""
    deltas, text, stopped = feed("AENB", ("END",))
    assert text == "AENB" and not stopped
    assert deltas[:3] == ["A", "", ""]


def test_earliest_of_several_stop_strings_wins() -> None:
    _, text, _ = feed("one two three", ("three", "two"))
    assert text == "one "


def test_without_stop_strings_every_token_is_emitted_at_once() -> None:
    deltas, text, stopped = feed("abc", ())
    assert deltas == ["a", "b", "c", ""] and text == "abc" and not stopped
