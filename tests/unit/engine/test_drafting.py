"""Drafts (``engine.drafting``): what prompt lookup proposes, and how a sequence's draft length
and pauses follow its drafts' outcomes."""

from __future__ import annotations

from engine.drafting import LONGEST_DRAFT, LONGEST_PAUSE, Drafter, DraftPolicy, PromptLookup


def test_the_latest_occurrence_of_the_longest_suffix_is_continued() -> None:
    """[.. 7 8 9 | 1 2 ..] then later [.. 5 8 9 | 3 4 ..]; a sequence ending 8 9 drafts 3 4 (the
    latest occurrence), ending 7 8 9 drafts 1 2 (the longer match wins over the later one)."""
    prompt = [7, 8, 9, 1, 2, 0, 0, 5, 8, 9, 3, 4, 6]
    assert PromptLookup(prompt).draft([8, 9], 2) == [3, 4]
    assert PromptLookup(prompt).draft([7, 8, 9], 3) == [1, 2, 0]


def test_a_draft_is_cut_at_most_and_at_the_sequence_end() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 6])
    assert lookup.draft([1, 2], 3) == [3, 4, 5]
    assert PromptLookup([1, 2, 3]).draft([1, 2], 10) == [3, 1, 2]  # up to the sequence's end


def test_one_matching_token_or_no_match_drafts_nothing() -> None:
    assert PromptLookup([1, 2, 3, 4]).draft([9, 3], 4) == []  # only "3" recurs
    assert PromptLookup([1, 2, 3, 4]).draft([], 4) == []
    assert PromptLookup([5]).draft([], 4) == []


def test_generated_tokens_are_looked_up_as_they_come_past_the_first_buffer() -> None:
    """The answer itself is searched (a repeated phrase drafts its continuation), across the
    buffer's growth."""
    lookup = PromptLookup([1])
    generated = [100 + i for i in range(600)]
    assert lookup.draft(generated, 4) == []
    generated += [300, 301]  # 300 301 first came at 200 201, followed by 302..
    assert lookup.draft(generated, 4) == [302, 303, 304, 305]


def test_the_draft_length_doubles_while_accepted_and_falls_when_not() -> None:
    policy = DraftPolicy()
    start = policy.wanted()
    policy.update(start, start)
    assert policy.wanted() == 2 * start
    for _ in range(10):
        policy.update(policy.length, policy.length)
    assert policy.wanted() == LONGEST_DRAFT
    policy.update(LONGEST_DRAFT, 3)
    assert policy.wanted() == 4


def test_drafts_missing_in_a_row_pause_drafting_longer_each_time() -> None:
    """A first miss only shortens the draft; then pauses of 1, 2, 4, ... steps, up to
    ``LONGEST_PAUSE``; an accepted token ends them."""
    policy = DraftPolicy()
    policy.update(4, 0)
    assert policy.wanted() == 1
    pauses = []
    for _ in range(9):
        policy.update(1, 0)
        skipped = 0
        while policy.wanted() == 0:
            skipped += 1
        pauses.append(skipped)
    assert pauses == [1, 2, 4, 8, 16, 32, 64, 64, 64][: len(pauses)]
    assert max(pauses) == LONGEST_PAUSE
    policy.update(1, 1)
    assert policy.wanted() == 2


def test_a_drafter_counts_its_drafts_and_respects_its_room() -> None:
    drafter = Drafter([1, 2, 3, 4, 5, 6, 7, 8])
    assert drafter.draft([1, 2], room=2) == [3, 4]
    assert drafter.draft([1, 2], room=0) == []
    drafter.update(2, 1)
    drafter.update(0, 0)
    assert (drafter.drafted, drafter.accepted) == (2, 1)


def test_a_continuation_is_drafted_while_the_answer_follows_it() -> None:
    """What the cache held after the prompt is drafted token for token while the answer equals
    it; once the answer leaves it, prompt lookup drafts instead, for good."""
    drafter = Drafter([1, 2, 3, 9, 1, 2], continuation=[7, 8, 6, 5])
    assert drafter.draft([], room=3) == [7, 8, 6]
    assert drafter.draft([7, 8], room=8) == [6, 5]
    assert drafter.draft([7, 8, 6, 5], room=8) == []  # past its end, and no n-gram recurs
    other = Drafter([1, 2, 3, 9, 1, 2], continuation=[7, 8, 6, 5])
    assert other.draft([7, 2, 3], room=2) == [9, 1]  # left it at token 1: prompt lookup
    assert other.draft([7, 2, 3, 7, 8], room=2) == []
