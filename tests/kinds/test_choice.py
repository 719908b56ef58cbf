"""The choice kind: named options in the caller's order, pool labels that may be swapped, rotation, ask_if names."""

from __future__ import annotations

import pytest

from canvasread.kinds.choice import KIND
from canvasread.types import Capabilities, Distribution, Option, Question
from canvasread.wire import parse_request


def question(count: int = 3) -> Question:
    criteria = {f"o{i}": ("" if i == 1 else f"option {i}") for i in range(count)}
    body = {"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": criteria}}}
    [parsed] = parse_request(body)[1].questions
    return parsed


def test_options_keep_the_callers_order_and_are_limited_by_max_options() -> None:
    asked = question()
    assert asked.options == (Option("o0", "option 0"), Option("o1", None), Option("o2", "option 2"))
    assert KIND.criteria(asked) == {"o0": "option 0", "o1": None, "o2": "option 2"}
    assert KIND.option_limit(Capabilities(max_options=7, max_levels=3)) == (7, "options")
    assert KIND.rotates and KIND.relabel


def test_labels_are_the_pools_first_and_descriptions_follow_the_name() -> None:
    asked = question()
    assert KIND.labels(asked.option_names, pool=("A", "B", "C", "D")) == ["A", "B", "C"]
    assert KIND.labels(asked.option_names, pool=("A", "B")) == ["A", "B"]  # the canvas says there are too few
    assert [KIND.describe(option) for option in asked.options] == ["o0 — option 0", "o1", "o2 — option 2"]


def test_the_answer_is_the_argmax_with_its_confidence_and_every_probability() -> None:
    asked = question()
    answer = KIND.answer(asked, Distribution((0.2, 0.7, 0.1)), decimals=2)
    assert answer == {
        "type": "choice",
        "choice": "o1",
        "confidence": 0.55,
        "probabilities": {"o0": 0.2, "o1": 0.7, "o2": 0.1},
    }
    assert KIND.probabilities_of(answer, ("o2", "o0", "o1")) == (0.1, 0.2, 0.7)
    assert KIND.summary(answer) == ("o1\nconfidence 0.55", {"o0": 0.2, "o1": 0.7, "o2": 0.1})
    assert [KIND.bucket(k) for k in (2, 3, 5, 255)] == ["choice/2", "choice/3-4", "choice/5-8", "choice/129-256"]


def test_ask_if_takes_option_names_and_lists_at_most_ten() -> None:
    many = question(12)
    assert KIND.ask_if_problem(many, "o11") is None
    message = KIND.ask_if_problem(many, "nope")
    assert message is not None and message.endswith("'o8', 'o9', …") and "'o10'" not in message
    assert KIND.ask_if_value(many, Distribution((0.0,) * 11 + (1.0,))) == "o11"
    assert KIND.context(question(), Distribution((0.2, 0.7, 0.1))) == "o1, probability 0.70"
    assert KIND.confidence(question(), Distribution((1 / 3,) * 3)) == pytest.approx(0.0)
