"""Incremental detokenization with stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextStream:
    """Turns generated token ids into text deltas, cutting the text at the first stop string.

    Text is held back while it ends in an incomplete UTF-8 character or could be the start of a
    stop string, so a client never sees text that is later taken back.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.emitted = 0  # characters already handed out
        self.stopped = False
        self.stop_sequence: str | None = None  # the stop string that ended the text

    def push(self, token_id: int) -> str:
        """Add one token; returns the text that is now safe to emit (maybe ``""``).

        Sets ``stopped`` when a stop string appeared; the returned text then ends before it.
        """
        self.token_ids.append(token_id)
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        found = [(i, s) for s in self.stop if (i := text.find(s)) >= 0]
        if found:
            cut, self.stop_sequence = min(found)
            self.stopped = True
            return self._emit(text[: max(cut, self.emitted)])
        if text.endswith("\ufffd"):
            return ""
        return self._emit(text[: len(text) - self._held_back(text)])

    def finish(self) -> str:
        """Whatever was held back, at the end of a completion not ended by a stop string.

        A character left incomplete by the last token (``max_tokens`` cut it) is dropped.
        """
        if self.stopped:
            return ""
        return self._emit(self.tokenizer.decode(self.token_ids, skip_special_tokens=True).rstrip("\ufffd"))

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for n in range(min(len(text), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            if any(s.startswith(text[-n:]) for s in self.stop):
                return n
        return 0

    def _emit(self, text: str) -> str:
        delta = text[self.emitted :]
        self.emitted = max(self.emitted, len(text))
        return delta
