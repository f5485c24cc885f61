"""``cache_control`` breakpoints become a TTL plan over blocks (``proxy.serving.prompts.ttl_plan``:
the cache marks of a turn, and the tail stored where a breakpoint falls inside one), and
``usage.cache_creation`` splits what was stored by TTL (proxy/anthropic/caching.py)."""

from __future__ import annotations

from hashing import BLOCK_SIZE
from proxy.anthropic.caching import creation
from proxy.serving.prompts import ttl_plan


def test_blocks_ending_within_a_breakpoint_take_its_ttl() -> None:
    """A breakpoint at token 300 covers blocks 0 and 1 (they end at 128 and 256) and falls inside
    block 2 (its tail at 300 keeps the TTL); block 3 starts past it and takes the server's TTL,
    which is left off the end of the plan."""
    assert ttl_plan(3 * BLOCK_SIZE + 5, [(300, 3600)]) == (3600, 3600, 3600)


def test_the_first_covering_breakpoint_wins() -> None:
    """Breakpoints in prompt order: each block takes the TTL of the first one at or after its end."""
    plan = ttl_plan(4 * BLOCK_SIZE, [(128, 3600), (400, 300), (512, 3600)])
    assert plan == (3600, 300, 300, 3600)


def test_no_breakpoint_gives_an_empty_plan_and_a_short_prompt_its_tails_ttl() -> None:
    """Nothing marked: every block takes the server's TTL; a breakpoint in a prompt under one
    block gives the tail stored there its TTL."""
    assert ttl_plan(1000, []) == ()
    assert ttl_plan(BLOCK_SIZE - 1, [(100, 3600)]) == (3600,)


def test_a_block_a_breakpoint_falls_inside_takes_the_longest_ttl() -> None:
    """Block 3 holds the end of a 5-minute breakpoint and is covered by a 1-hour one: 1 hour."""
    assert ttl_plan(4 * BLOCK_SIZE, [(400, 300), (512, 3600)])[3] == 3600


def test_a_breakpoint_exactly_at_a_block_end_covers_that_block() -> None:
    """Position 256 is the end of block 1: blocks 0 and 1 are covered, block 2 is not."""
    assert ttl_plan(3 * BLOCK_SIZE, [(256, 300)]) == (300, 300)


def test_cache_creation_splits_the_stored_tokens_by_their_blocks_ttl() -> None:
    """Tokens stored from position 100 on, 300 of them: block 0's 28 under a 5-minute mark, block
    1's 128 under an hour's, block 2's 128 and block 3's 16 past the plan (the server's TTL)."""
    split = creation((300, 3600), 3600, 100, 300)
    assert split == {"ephemeral_5m_input_tokens": 28, "ephemeral_1h_input_tokens": 272}
    assert creation((300, 3600), 600, 100, 300) == {
        "ephemeral_5m_input_tokens": 28 + 144,
        "ephemeral_1h_input_tokens": 128,
    }
    assert creation((), 3600, 0, 0) == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
