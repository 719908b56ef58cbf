"""The score kind: levels as sent, digit labels, the expected level as the answer, level indices for ask_if."""

from __future__ import annotations

import pytest

from canvasread.kinds.score import KIND, expected_score
from canvasread.types import Capabilities, Distribution, Option, Question
from canvasread.wire import parse_request


def question() -> Question:
    body = {"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": ["calm", "", {"x": 1}]}}}
    [parsed] = parse_request(body)[1].questions
    return parsed


def test_levels_are_echoed_as_sent_and_limited_by_max_levels() -> None:
    asked = question()
    assert asked.options == (Option("0", "calm"), Option("1", ""), Option("2", {"x": 1}))
    assert KIND.criteria(asked) == ["calm", "", {"x": 1}]
    assert KIND.option_limit(Capabilities(max_options=7, max_levels=3)) == (3, "levels")
    assert not KIND.rotates  # levels are ordered by meaning


def test_labels_are_digits_and_the_prompt_describes_each_level_by_its_text() -> None:
    asked = question()
    assert KIND.labels(asked.option_names, pool=("A", "B", "C")) == ["0", "1", "2"]
    assert [KIND.describe(option) for option in asked.options] == ["calm", "", '{"x":1}']
    assert KIND.header.format(top=len(asked.options) - 1) == "score from 0 (lowest) to 2"


def test_the_answer_is_the_expected_level_named_by_its_legend() -> None:
    asked = question()
    answer = KIND.answer(asked, Distribution((0.1, 0.3, 0.6)), decimals=None)
    assert answer["score"] == pytest.approx(expected_score((0.1, 0.3, 0.6))) == pytest.approx(1.5)
    assert answer["legend"] == {"0": "calm", "1": "", "2": {"x": 1}}
    words, bars = KIND.summary({**answer, "legend": {"0": "calm", "1": "mid", "2": "high"}})
    assert words.startswith("high (score 1.50)") and bars == {"calm": 0.1, "mid": 0.3, "high": 0.6}
    assert KIND.bucket(10) == "score/9-16"


def test_ask_if_takes_level_indices_never_booleans() -> None:
    asked = question()
    assert KIND.ask_if_problem(asked, 2) is None
    for value in (3, True, "2"):
        assert KIND.ask_if_problem(asked, value) == "'q' is a score: its answers are the level indices 0..2"
    assert KIND.ask_if_value(asked, Distribution((0.1, 0.3, 0.6))) == 2
    context = KIND.context(asked, Distribution((0.1, 0.3, 0.6)))
    assert context == 'level 2 of 0-2 ({"x":1}), probability 0.60, expected score 1.50'
