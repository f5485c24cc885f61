"""proxy/anthropic/protocol.py: ``cache_control`` breakpoints become a TTL plan over full blocks."""

from __future__ import annotations

from hashing import BLOCK_SIZE
from proxy.anthropic.protocol import breakpoint_ttls


def test_blocks_ending_within_a_breakpoint_take_its_ttl() -> None:
    """A breakpoint at token 300 covers blocks 0 and 1 (they end at 128 and 256); block 2 ends at 384,
    past it, and takes the server's TTL, which is left off the end of the plan."""
    assert breakpoint_ttls(3 * BLOCK_SIZE + 5, [(300, 3600)]) == (3600, 3600)


def test_the_first_covering_breakpoint_wins() -> None:
    """Breakpoints in prompt order: each block takes the TTL of the first one at or after its end."""
    plan = breakpoint_ttls(4 * BLOCK_SIZE, [(128, 3600), (400, 300), (512, 3600)])
    assert plan == (3600, 300, 300, 3600)


def test_no_breakpoint_and_short_prompts_give_an_empty_plan() -> None:
    """Nothing marked, or no full block: every block takes the server's TTL."""
    assert breakpoint_ttls(1000, []) == ()
    assert breakpoint_ttls(BLOCK_SIZE - 1, [(100, 3600)]) == ()


def test_a_breakpoint_exactly_at_a_block_end_covers_that_block() -> None:
    """Position 256 is the end of block 1: blocks 0 and 1 are covered, block 2 is not."""
    assert breakpoint_ttls(3 * BLOCK_SIZE, [(256, 300)]) == (300, 300)
