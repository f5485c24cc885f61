"""hashing/tails.py: a tail's name depends on what it follows and on each of its tokens, never
collides with a block's, and its short name is the name of all but its last token."""

from __future__ import annotations

import pytest

from hashing import (
    BLOCK_SIZE,
    NamespaceIdentity,
    block_hashes,
    chain_hash,
    shared_tokens,
    short_tail_hash,
    tail_hash,
)

NS = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="t").digest()
OTHER = NamespaceIdentity(model_fingerprint="m", kv_dtype="float32", tenant="u").digest()


def test_a_tail_is_named_by_its_tip_and_every_token() -> None:
    tip = block_hashes(list(range(BLOCK_SIZE)), NS)[0]
    ids = [5, 6, 7]
    assert tail_hash(tip, ids) == tail_hash(tip, list(ids))
    assert tail_hash(tip, ids) != tail_hash(NS, ids)  # another tip
    assert tail_hash(NS, ids) != tail_hash(OTHER, ids)  # another namespace (tenant)
    assert tail_hash(tip, ids) != tail_hash(tip, [5, 6, 8])
    assert tail_hash(tip, ids) != tail_hash(tip, [5, 6])
    assert len(tail_hash(tip, ids)) == 16


def test_a_tail_never_shares_a_name_with_a_block() -> None:
    ids = list(range(BLOCK_SIZE - 1))
    assert tail_hash(NS, ids) != chain_hash(NS, ids)


def test_the_short_name_is_the_name_of_all_but_the_last_token() -> None:
    assert short_tail_hash(NS, [1, 2, 3]) == tail_hash(NS, [1, 2])
    assert short_tail_hash(NS, [1]) is None


@pytest.mark.parametrize("length", [0, BLOCK_SIZE, BLOCK_SIZE + 1])
def test_a_tail_holds_1_to_127_tokens(length: int) -> None:
    with pytest.raises(ValueError):
        tail_hash(NS, list(range(length)))


def test_a_tail_serves_its_longest_common_prefix_within_the_room() -> None:
    """Tokens served: the common prefix of the tail and the prompt's rest, never past ``room``."""
    tail = (5, 6, 7, 8)
    assert shared_tokens(tail, (5, 6, 7, 8, 9), 127) == 4  # all of it
    assert shared_tokens(tail, (5, 6, 7, 8), 3) == 3  # a repeat: all but the prompt's last token
    assert shared_tokens(tail, (5, 6, 9, 8), 127) == 2  # up to the first token that differs
    assert shared_tokens(tail, (4, 6, 7, 8), 127) == 0
    assert shared_tokens(tail, (5, 6), 127) == 2  # the prompt ends first
    assert shared_tokens(tail, (5, 6, 7, 8), 0) == 0
