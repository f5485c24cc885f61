"""Log-probabilities in OpenAI's two shapes, with each token's own bytes.

Source: the OpenAI API reference, chat ``logprobs.content[]`` (``token``, ``logprob``, ``bytes``,
``top_logprobs``) and legacy completions ``logprobs`` (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from transformers.convert_slow_tokenizer import bytes_to_unicode

from engine.requests import TokenDelta
from proxy.openai.replies import ChatLogprobs, CompletionLogprobs, TopLogprob

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable character map (GPT-2's)."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The bytes a token stands for, also when they are part of a character split over several
    tokens (decoding such a token alone gives U+FFFD; its bytes are the real ones)."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if token is None:
        return b""
    decoder = _byte_decoder()
    if all(char in decoder for char in token):  # byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen...)
        return bytes(decoder[char] for char in token)
    if match := _BYTE_FALLBACK.fullmatch(token):  # SentencePiece byte fallback
        return bytes([int(match.group(1), 16)])
    return str(tokenizer.convert_tokens_to_string([token])).encode()


def chat_logprobs(tokenizer: Any, tokens: Sequence[TokenDelta]) -> ChatLogprobs:
    """Chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def entry(token_id: int, logprob: float) -> TopLogprob:
        return {
            "token": tokenizer.decode([token_id]),
            "logprob": logprob,
            "bytes": list(token_bytes(tokenizer, token_id)),
        }

    return {
        "content": [
            {**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top_logprobs]}
            for t in tokens
        ]
    }


def completion_logprobs(tokenizer: Any, tokens: Sequence[TokenDelta], offset: int) -> CompletionLogprobs:
    """Legacy completions ``logprobs`` for ``tokens``, the first of which starts at character
    ``offset`` of the returned text.

    ``text_offset[i]`` is where token i's text starts in the returned text: the length of all
    text returned before it (a token that ends inside a character adds nothing until the token
    completing the character), so offsets are the same streamed and not. ``top_logprobs`` maps
    each alternative's text to its log-probability; an alternative whose text is already a key
    (two tokens holding different parts of one character both read U+FFFD) is keyed
    ``"token_id:<id>"``, so every position carries every alternative asked for.
    """
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {
        "tokens": [tokenizer.decode([t.token_id]) for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [_alternatives(tokenizer, t.top_logprobs) for t in tokens],
        "text_offset": offsets,
    }


def _alternatives(tokenizer: Any, top: Sequence[tuple[int, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for token_id, logprob in top:
        text = tokenizer.decode([token_id])
        out[text if text not in out else f"token_id:{token_id}"] = logprob
    return out
