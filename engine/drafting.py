"""Drafts for exact speculative decoding: tokens a sequence is likely to write next, read from
the tokens it already holds (prompt lookup; no draft model).

A draft is only a guess. The runner feeds the sequence's last token and the draft in one
multi-row native step (``engine.kernels.native``: each row bit for bit a single step), samples row
by row with the request's own sampler, and keeps the draft only as far as each sampled token equals
it. So the tokens emitted, greedy or seeded, are exactly those decoding without drafts emits: a
draft changes how many tokens one step yields, never which. The rows past the first disagreement
are wasted work, which ``DraftPolicy`` keeps small where drafts miss (prose).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LONGEST_NGRAM = 4
SHORTEST_NGRAM = 2
"""The suffix n-grams looked up, longest first (tokens). A single token recurs everywhere in
prose, so a 1-gram's continuation is rarely right; two tokens already pin down a quoted span."""

LONGEST_DRAFT = 16
"""The most draft tokens of one sequence in one step: a step's rows cost arithmetic each (about a
fifth of a single step's time per row on an AVX-512 CPU with SmolLM2), so a longer draft is only
worth it when most of it is accepted, which ``DraftPolicy`` learns per sequence."""

LONGEST_PAUSE = 64
"""The most decode steps a sequence goes without drafting after drafts that were wholly rejected."""


class PromptLookup:
    """Drafts from a sequence's own tokens: after the latest earlier occurrence of its last n
    tokens (n from ``LONGEST_NGRAM`` down to ``SHORTEST_NGRAM``), the tokens that followed it.

    Copy-heavy answers (a document quoted, code rewritten with one change, tool output echoed, a
    tool call repeating long arguments) draft well; prose matches less often, and a small model's
    prose that repeats its own phrases drafts them.

    Args:
        prompt: the prompt's token ids; ``draft`` is passed what was generated since.
    """

    def __init__(self, prompt: Sequence[int]) -> None:
        self._tokens = np.empty(max(2 * len(prompt), 256), dtype=np.int64)
        self._tokens[: len(prompt)] = prompt
        self._prompt = self._length = len(prompt)

    def _extend(self, generated: Sequence[int]) -> None:
        end = self._prompt + len(generated)
        if end > self._tokens.size:
            self._tokens = np.resize(self._tokens, 2 * end)
        self._tokens[self._length : end] = generated[self._length - self._prompt :]
        self._length = end

    def draft(self, generated: Sequence[int], most: int) -> list[int]:
        """Up to ``most`` tokens likely to follow the prompt and ``generated`` (token ids; [] when
        no n-gram recurs). Costs a few vectorised passes over the sequence (tens of microseconds
        at 32k tokens)."""
        self._extend(generated)
        length, tokens = self._length, self._tokens
        for n in range(min(LONGEST_NGRAM, length - 1), SHORTEST_NGRAM - 1, -1):
            # NOTE: candidates i in [0, length - n): an occurrence ending before the suffix itself
            found = tokens[: length - n] == tokens[length - n]
            for j in range(1, n):
                found &= tokens[j : length - n + j] == tokens[length - n + j]
            hits = np.flatnonzero(found)
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start : min(start + most, length)].tolist()
        return []


class DraftPolicy:
    """How many tokens one sequence drafts next, learned from its own drafts.

    The length doubles while drafts are accepted whole (up to ``LONGEST_DRAFT``) and falls to one
    more than the accepted part otherwise. From the second draft in a row rejected at its first
    token, drafting pauses for 1, 2, 4, ... steps (up to ``LONGEST_PAUSE``), so a sequence whose
    drafts keep missing spends about one row in ``LONGEST_PAUSE`` steps on them.
    """

    def __init__(self) -> None:
        self.length = 4
        self.misses = 0
        self.paused = 0

    def wanted(self) -> int:
        """Draft tokens to look for this step (0: none)."""
        if self.paused:
            self.paused -= 1
            return 0
        return self.length

    def update(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens had its first ``accepted`` accepted."""
        if accepted == drafted:
            self.length = min(2 * self.length, LONGEST_DRAFT)
        else:
            self.length = max(accepted + 1, 1)
        if accepted:
            self.misses = 0
        else:
            self.misses += 1
            self.paused = min(2 ** (self.misses - 2), LONGEST_PAUSE) if self.misses > 1 else 0


class Drafter:
    """One sequence's drafting, steered by ``DraftPolicy``, with its counts: while the answer
    follows ``continuation`` (what the cache holds after this very prompt: the start of an answer
    it got before, ``store.interface.PrefixMatch.continuation``), its next tokens; else
    ``PromptLookup``'s."""

    def __init__(self, prompt: Sequence[int], continuation: Sequence[int] = ()) -> None:
        self.lookup, self.policy = PromptLookup(prompt), DraftPolicy()
        self.continuation = tuple(continuation)
        self._followed = 0  # leading tokens of the answer known to equal the continuation's
        self.drafted = self.accepted = 0

    def draft(self, generated: Sequence[int], room: int) -> list[int]:
        """The next draft (token ids), at most ``room`` tokens (what the request and the context
        still allow)."""
        most = min(self.policy.wanted(), room)
        if most <= 0:
            return []
        n, known = len(generated), self.continuation
        while self._followed < min(n, len(known)) and generated[self._followed] == known[self._followed]:
            self._followed += 1
        if self._followed == n < len(known):
            return list(known[n : n + most])
        self.continuation = ()  # the answer left it (or ran past it): for good
        return self.lookup.draft(generated, most)

    def update(self, drafted: int, accepted: int) -> None:
        """The outcome of a draft of ``drafted`` tokens: its first ``accepted`` were kept."""
        if drafted:
            self.policy.update(drafted, accepted)
            self.drafted += drafted
            self.accepted += accepted
