"""Splitting past a peer's caps: near-equal option groups, calls within the cap, and a tournament whose answer
is a proper distribution led by the final's favourite group."""

from __future__ import annotations

import pytest

from canvasread.systemone.peers import Ask, Reply
from canvasread.systemone.split import CERTAIN, QuestionPlan, in_calls, max_options, option_groups
from canvasread.types import Option, Question


def choice(count: int) -> Question:
    return Question("q", "choice", "Which?", tuple(Option(f"o{i}", f"option {i}") for i in range(count)))


def test_groups_are_near_equal_and_cover_every_option_once() -> None:
    for count in (1, 2, 26, 27, 100, 255):
        groups = option_groups(count, 26)
        sizes = [len(group) for group in groups]
        assert [i for group in groups for i in group] == list(range(count))
        assert max(sizes) <= 26 and max(sizes) - min(sizes) <= 1
        assert len(groups) <= 26
    assert max_options(26) == 676


def test_calls_stay_within_the_cap() -> None:
    asks = [Ask("noul", "x", ()) for _ in range(130)]
    assert [len(call) for call in in_calls(asks, 64)] == [64, 64, 2]
    assert [len(call) for call in in_calls(asks, None)] == [130]


def test_a_question_within_the_cap_is_asked_as_it_is() -> None:
    plan = QuestionPlan.of(choice(5), 26)
    [(group, ask)] = plan.first()
    assert group == 0 and ask.options == choice(5).options
    reply = Reply((0.1, 0.2, 0.3, 0.25, 0.15), 0.9)
    assert plan.final([reply]) is None
    combined = plan.combine([reply], None, "vllm:m")
    assert combined.probabilities == reply.probabilities
    assert combined.details == {"engine": "vllm:m", "label_mass": 0.9}


def test_a_tournament_is_a_proper_distribution_led_by_the_final() -> None:
    plan = QuestionPlan.of(choice(60), 26)
    assert [len(group) for group in plan.groups] == [20, 20, 20]
    groups = [Reply(tuple((2.0 if i == 3 else 1.0) / 21 for i in range(20)), 0.8) for _ in range(3)]
    final = plan.final(groups)
    assert final is not None and [option.name for option in final.options] == ["o3", "o23", "o43"]
    combined = plan.combine(groups, Reply((0.2, 0.7, 0.1), 0.95), "vllm:m")
    assert sum(combined.probabilities) == pytest.approx(1.0)
    assert max(range(60), key=combined.probabilities.__getitem__) == 23
    assert combined.probabilities[23] == pytest.approx(0.7 * 2 / 21)
    assert combined.details["tournament"] == {"groups": 3, "finalists": ["o3", "o23", "o43"]}
    assert combined.details["label_mass"] == 0.8


def test_a_group_of_one_needs_no_ask() -> None:
    plan = QuestionPlan.of(choice(1), 26)
    assert plan.first() == [] and plan.combine([CERTAIN], None, "jev:m").probabilities == (1.0,)
    scores = QuestionPlan.of(Question("s", "score", "How?", tuple(Option(str(i), None) for i in range(10))), 2)
    assert len(scores.groups) == 1, "a score's levels are never split"
