"""`scheduler.pack` on its own: turns across prompts, oldest first, each queue in order, within budget and rows;
thoughts (background) in what the reads leave; and `Share`, the time thoughts may take beside reads."""

from __future__ import annotations

import pytest

from canvasread.canvas.engine.scheduler import Share, Sized, pack


def queue(name: str, *tokens: int) -> list[Sized[str]]:
    return [Sized(f"{name}{n}", size) for n, size in enumerate(tokens)]


def test_each_queue_gives_one_unit_a_turn_oldest_first() -> None:
    queues = [queue("a", 1, 1, 1, 1), queue("b", 1), queue("c", 1, 1)]
    assert pack(queues, budget=100, max_rows=100) == ["a0", "b0", "c0", "a1", "c1", "a2", "a3"]


def test_the_budget_closes_a_queue_whose_next_unit_does_not_fit_and_others_go_on() -> None:
    """a's second unit (8 tokens) does not fit what is left, so a is done; b's small units still go in."""
    queues = [queue("a", 4, 8, 1), queue("b", 2, 2, 2)]
    assert pack(queues, budget=10, max_rows=100) == ["a0", "b0", "b1", "b2"]


def test_a_unit_that_depends_on_one_left_out_is_never_taken() -> None:
    """A queue is taken in order: a canvas after an encoding row that did not fit waits for the next pass."""
    queues = [queue("old", 6), queue("new", 8, 1)]
    assert pack(queues, budget=10, max_rows=100) == ["old0"]


def test_rows_are_capped() -> None:
    queues = [queue("a", 1, 1, 1), queue("b", 1, 1, 1)]
    assert pack(queues, budget=100, max_rows=4) == ["a0", "b0", "a1", "b1"]


def test_nothing_to_do_and_nothing_that_fits_give_an_empty_pass() -> None:
    assert pack([], budget=10, max_rows=4) == []
    assert pack([queue("a", 11)], budget=10, max_rows=4) == []


def test_thoughts_come_after_the_reads_and_only_as_many_queues_as_let_step() -> None:
    reads = [queue("r", 2, 2)]
    thoughts = [[], queue("t", 3, 3), queue("u", 3)]
    assert pack(reads, background=thoughts, background_queues=1, budget=100, max_rows=100) == ["r0", "r1", "t0", "t1"]
    assert pack([], background=thoughts, background_queues=1, budget=100, max_rows=100) == ["t0", "t1"]


def test_every_thought_takes_its_turns_when_all_may_step() -> None:
    thoughts = [queue("t", 3, 3), queue("u", 3)]
    assert pack([queue("r", 1)], background=thoughts, budget=100, max_rows=100) == ["r0", "t0", "u0", "t1"]


def test_thoughts_get_only_the_budget_and_rows_that_reads_leave() -> None:
    assert pack([queue("r", 8)], background=[queue("t", 3)], budget=10, max_rows=100) == ["r0"]
    assert pack([queue("r", 1, 1)], background=[queue("t", 1)], budget=10, max_rows=2) == ["r0", "r1"]


def test_a_share_of_nothing_never_lets_background_work_step_beside_reads() -> None:
    share = Share(0.0)
    assert not share.allows()
    share.spent(reads=5.0, background=0.0)
    assert not share.allows()


def test_a_share_allows_a_step_while_background_time_is_within_its_fraction() -> None:
    share = Share(0.25)
    assert share.allows(), "nothing spent yet: the first pass that reads may step"
    share.spent(reads=3.0, background=1.0)
    assert share.allows()  # 1 of 4
    share.spent(reads=3.0, background=2.0)
    assert not share.allows()  # 3 of 9
    share.spent(reads=5.0, background=0.0)
    assert share.allows()  # 3 of 14
    share.forget()
    assert share.allows()


def test_over_many_passes_background_work_takes_its_share_and_no_more_than_one_step_over() -> None:
    """Each pass reads for 3 s; a background step (when allowed) adds 2 s. Over any run the background time is
    within the fraction of the whole, give or take the one step that crossed it."""
    for fraction in (0.05, 0.15, 0.3):  # a step every pass would be 2 of 5
        share, reads, background = Share(fraction), 0.0, 0.0
        for _ in range(200):
            step = 2.0 if share.allows() else 0.0
            share.spent(reads=3.0, background=step)
            reads, background = reads + 3.0, background + step
            assert background <= fraction * (reads + background) + 2.0
        assert background >= fraction * (reads + background) - 2.0, "nor does it take less"


def test_a_share_is_a_fraction() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        Share(1.5)
