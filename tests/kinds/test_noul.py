"""The noul kind: sides from the wire, yes/no labels, P(true) as the answer, and what stages and people read."""

from __future__ import annotations

from typing import Any

import pytest

from canvasread.errors import InvalidRequest
from canvasread.kinds.noul import KIND, NoulQuestion
from canvasread.types import Distribution, Option, Question
from canvasread.wire import parse_request


def question(**wire: Any) -> Question:
    body = {"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "Refund?", **wire}}}
    [parsed] = parse_request(body)[1].questions
    return parsed


def test_the_sides_come_true_then_false_an_empty_description_being_none() -> None:
    asked = question(criteria={"true": "money back", "false": ""})
    assert asked.options == (Option("true", "money back"), Option("false", None))
    assert KIND.criteria(asked) == {"true": "money back"}  # only the described sides, as sparrow reads them
    assert KIND.options(NoulQuestion(type="noul", instructions="x")) == (Option("true"), Option("false"))


@pytest.mark.parametrize("instructions", [None, "", "   ", "\n\t"])
@pytest.mark.parametrize("criteria", [None, {"true": "", "false": " "}])
def test_blank_instructions_and_sides_ask_nothing_so_are_one_422(instructions: str | None, criteria: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        question(instructions=instructions, criteria=criteria)
    [problem] = caught.value.problems
    assert problem.loc == ("questions", "q", "noul")
    assert "needs instructions or at least one described side" in problem.msg


def test_a_blank_side_is_undescribed_like_an_empty_one() -> None:
    asked = question(instructions="  ", criteria={"true": "money back", "false": " \n"})
    assert asked.options == (Option("true", "money back"), Option("false", None))


def test_the_canvas_reads_yes_and_no_described_by_default_as_the_statement() -> None:
    asked = question(criteria={"true": "money back"})
    assert KIND.labels(asked.option_names, pool=("A", "B")) == ["yes", "no"]
    assert [KIND.describe(option) for option in asked.options] == ["money back", "the statement does not hold"]


def test_the_answer_is_p_true_and_reads_back_as_both_sides() -> None:
    asked = question()
    answer = KIND.answer(asked, Distribution((0.8, 0.2)), decimals=None)
    assert answer == {"type": "noul", "noul": 0.8}
    assert KIND.probabilities_of(answer, ("false", "true")) == pytest.approx((0.2, 0.8))
    assert KIND.summary(answer) == ("yes\nP(yes) 0.800", {"yes": 0.8, "no": pytest.approx(0.2)})
    assert KIND.confidence(asked, Distribution((0.8, 0.2))) == pytest.approx(0.6)
    assert KIND.bucket(2) == "noul"


def test_ask_if_takes_booleans_and_a_tie_reads_as_true() -> None:
    asked = question()
    assert KIND.ask_if_problem(asked, True) is None
    assert KIND.ask_if_problem(asked, "yes") == "'q' is a noul: its answers are true and false"
    assert KIND.ask_if_value(asked, Distribution((0.5, 0.5))) is True
    assert KIND.ask_if_value(asked, Distribution((0.3, 0.7))) is False
    assert KIND.context(asked, Distribution((0.3, 0.7))) == "no, probability 0.70"
