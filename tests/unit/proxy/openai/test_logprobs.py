"""Log-probabilities: each token's own bytes, every alternative kept, offsets into the text."""

from __future__ import annotations

from engine.requests import TokenDelta
from proxy.openai.logprobs import chat_logprobs, completion_logprobs, token_bytes

TEXT = "naïve 😀 中文 ok"


def test_token_bytes_join_to_the_utf8_of_the_text(tiny_model) -> None:
    """Tokens holding part of a character carry their own bytes, never U+FFFD's."""
    tokenizer = tiny_model.tokenizer
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert any(tokenizer.decode([i]) == "\ufffd" for i in ids)  # some tokens split a character
    assert b"".join(token_bytes(tokenizer, i) for i in ids) == TEXT.encode()
    content = chat_logprobs(tokenizer, [TokenDelta(i, "") for i in ids])["content"]
    assert b"".join(bytes(entry["bytes"]) for entry in content) == TEXT.encode()


def test_alternatives_with_the_same_text_are_all_kept(tiny_model) -> None:
    """Five byte tokens that each decode to U+FFFD: five alternatives, told apart by id."""
    tokenizer = tiny_model.tokenizer
    partial = [i for i in range(tokenizer.vocab_size) if tokenizer.decode([i]) == "\ufffd"][:5]
    assert len(partial) == 5
    top = tuple((i, -float(n)) for n, i in enumerate(partial))
    alternatives = completion_logprobs(tokenizer, [TokenDelta(partial[0], "", -0.0, top)], 0)["top_logprobs"]
    assert len(alternatives[0]) == 5
    assert sorted(alternatives[0].values(), reverse=True) == [lp for _, lp in top]
    assert [k for k in alternatives[0] if k.startswith("token_id:")] == [f"token_id:{i}" for i in partial[1:]]


def test_text_offsets_index_the_returned_text(tiny_model) -> None:
    """A token ending inside a character adds nothing until the token completing it."""
    tokens = [TokenDelta(1, "a"), TokenDelta(2, ""), TokenDelta(3, "é"), TokenDelta(4, "bc")]
    assert completion_logprobs(tiny_model.tokenizer, tokens, 5)["text_offset"] == [5, 6, 6, 7]
