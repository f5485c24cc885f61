"""Where a stored response's continuation starts: the token ids its turn computed, so that
``previous_response_id`` is a full-prefix hit even where the chat template would tokenize the
answer's text apart from the tokens the model generated.

At the end of a turn the conversation through the answer is rendered as the next prompt will
begin (the history ``H``: the turn's rendered prompt ``R``, the answer's text tokenized ``A``,
the template's end-of-turn markers ``E``). When ``H`` is ``R + A + E``, the stored ids are
``P + G + E``: ``P`` the prompt the turn computed, ``G`` the answer's tokens as generated, whose
K/V the cache stored; else (the template rewrites the answer: tool calls, dropped reasoning)
they are ``H``. A continuation's prompt is its chat rendering ``R'``; when ``R'`` starts with
``H`` (same instructions, tools and history), the stored ids stand for ``H``: the prompt is the
stored ids, then ``R'`` after ``H``, and its own ``P`` is that. Where every ``G`` is its ``A``
(the usual case) that is ``R'`` itself, what ``/v1/chat/completions`` computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

from proxy.http.errors import OpenAIError
from proxy.openai.protocol import ChatMessage
from proxy.openai.turns import messages_prompt_ids
from proxy.tools.rendering import TemplateMessage


@dataclass(frozen=True)
class Continuation:
    """What a continuation of a stored response starts with.

    Attributes:
        token_ids: the ids every continuation's prompt starts with (``P + G + E``, or ``H``).
        rendered: the length of ``H`` in tokens.
        digest: xxh3-64 of ``H`` (little-endian uint32 ids), to tell whether ``R`` starts with it.
    """

    token_ids: list[int]
    rendered: int
    digest: str

    def prompt(self, rendered: list[int]) -> list[int]:
        """The prompt of a continuation whose chat rendering is ``rendered`` (``R``)."""
        if len(rendered) > self.rendered and _digest(rendered[: self.rendered]) == self.digest:
            return self.token_ids + rendered[self.rendered :]
        return rendered


def continuation(
    tokenizer: Any,
    vocab_size: int,
    messages: list[TemplateMessage],
    tools: list[Any] | None,
    rendered: list[int],
    prompt_ids: list[int],
    generated: list[int],
    text: str,
) -> Continuation | None:
    """The continuation of a turn: ``messages`` (chat messages through its answer, instructions
    first) rendered with ``tools``; the turn's prompt as rendered and as computed; the ids it
    generated and their text (None when the conversation cannot be rendered)."""
    try:
        history = messages_prompt_ids(
            tokenizer, vocab_size, [ChatMessage.model_validate(m) for m in messages], False, tools=tools
        )
    except (OpenAIError, ValueError):  # NOTE: it rendered a moment ago; never fail a response for it
        return None
    answer = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    end = len(rendered) + len(answer)
    ids = history
    if history[: len(rendered)] == rendered and history[len(rendered) : end] == answer:
        ids = prompt_ids + generated + history[end:]
    return Continuation(ids, len(history), _digest(history))


def _digest(ids: list[int]) -> str:
    return xxhash.xxh3_64_hexdigest(b"".join(i.to_bytes(4, "little") for i in ids))
