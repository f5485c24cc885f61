"""Grammar-constrained decoding: a sequence's next tokens masked to those its grammar allows.

The grammar is llguidance's (Lark with embedded JSON schemas, or one JSON schema; built by the
server, ``proxy.tools``). llguidance computes, per step, the set of tokens that keep the output
a prefix of some sentence of the grammar; the sampler then draws only among them. The mask is
applied to one sequence's row of logits, on a copy: the other rows of a batched decode step are
never touched, so an unconstrained request's tokens are what they are without any grammar.

Source: llguidance's ``LLMatcher`` (guidance-ai/llguidance), the engine used by llama.cpp's,
vLLM's and SGLang's structured output.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Any

import llguidance
import llguidance.hf
import torch


class GrammarError(ValueError):
    """A grammar llguidance cannot compile (an unsupported schema feature, a bad pattern)."""


@lru_cache(maxsize=8)
def _tokenizer(tokenizer: Any, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of a transformers fast tokenizer, with ``vocab_size`` entries (the
    model's logits, which may be longer than the tokenizer's vocabulary). Built once (~1 s)."""
    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)


Key = tuple[Any, int, bytes]
"""A verdict's key: the tokenizer, the logits' length, the grammar's SHA-256."""


class Verdicts:
    """llguidance's verdicts on grammars, most recently used kept, within ``max_bytes``.

    NOTE: keyed by a digest of the grammar, not the grammar itself: grammars come from request
    schemas (megabytes each, possibly), so the cache holds 32-byte keys and the verdicts' text
    (an error or warnings, "" for a grammar that compiles cleanly), and evicts the least recently used past
    ``max_bytes``. Safe to use from several threads.
    """

    ENTRY_BYTES = 200
    """What one entry costs besides its verdict's text (key, tuple, dict slot), in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[Key, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key) -> str | None:
        with self._lock:
            verdict = self._entries.get(key)
            if verdict is not None:
                self._entries.move_to_end(key)
            return verdict

    def put(self, key: Key, verdict: str) -> None:
        cost = self.ENTRY_BYTES + len(verdict)
        with self._lock:
            if key in self._entries or cost > self.max_bytes:
                return
            self._entries[key] = verdict
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= self.ENTRY_BYTES + len(old)

    def __len__(self) -> int:
        return len(self._entries)


_VERDICTS = Verdicts(max_bytes=4 * 1024 * 1024)
"""Once per grammar: an agent sends the same tools with every request (4 MiB hold ~20,000)."""


def check_grammar(tokenizer: Any, vocab_size: int, grammar: str) -> tuple[str, ...]:
    """Compile ``grammar`` against the tokenizer, once per distinct grammar (``_VERDICTS``).

    Returns:
        llguidance's warnings: what a lenient schema (``"lenient": true`` in its ``x-guidance``)
        left unenforced, e.g. ``Unimplemented keys: ["propertyNames"]`` or ``Unknown format: x``;
        empty for a grammar enforced in full.

    Raises:
        GrammarError: llguidance's message, e.g. ``Unimplemented keys: ["not"]``.
    """
    key = (tokenizer, vocab_size, hashlib.sha256(grammar.encode()).digest())
    verdict = _VERDICTS.get(key)
    if verdict is None:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, _tokenizer(tokenizer, vocab_size)
        )
        # NOTE: a verdict is text (the cache weighs it by its length): "" for a clean compile,
        # else JSON ``[failed, messages]``
        verdict = json.dumps([failed, messages]) if failed or messages else ""
        _VERDICTS.put(key, verdict)
    failed, messages = json.loads(verdict) if verdict else (False, [])
    if failed:
        raise GrammarError("; ".join(messages))
    return tuple(messages)


class Constraint:
    """One sequence's grammar state: which tokens may come next, advanced by each sampled token.

    Args:
        tokenizer: the model's transformers (fast) tokenizer.
        vocab_size: the length of a logits row.
        grammar: an llguidance grammar (``llguidance.LLMatcher.grammar_from_*``).
        eos_token_ids: the model's end tokens; allowed exactly where the grammar may end.

    Raises:
        GrammarError: the grammar does not compile.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, grammar: str, eos_token_ids: frozenset[int]) -> None:
        self._matcher = llguidance.LLMatcher(_tokenizer(tokenizer, vocab_size), grammar, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(self._matcher.get_error())
        self._eos = sorted(eos_token_ids)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``[vocab_size]`` with every token the grammar forbids at ``-inf`` (a copy).

        The model's end tokens are allowed where the grammar is complete, and only there.
        """
        allowed = torch.frombuffer(bytearray(self._matcher.compute_logit_bias()), dtype=torch.uint8)
        allowed = allowed.to(logits.device)[: logits.shape[-1]].bool()
        if self._eos:
            # NOTE: and where no token can go on (text only a control token spells): the end
            allowed[self._eos] = self._matcher.is_accepting() or not allowed.any()
        return logits.masked_fill(~allowed, float("-inf"))

    def accept(self, token: int) -> None:
        """Advance past ``token`` (an end token ends the grammar)."""
        if token not in self._eos:
            self._matcher.consume_token(token)

    @property
    def complete(self) -> bool:
        """Nothing more may follow: the output is a whole sentence of the grammar (or the matcher
        failed, which a masked sampler cannot cause); the sequence ends here."""
        return self._matcher.is_stopped()
