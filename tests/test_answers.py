from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canvasread.answers import build_answer
from canvasread.kinds.base import confidence
from canvasread.kinds.score import expected_score
from canvasread.types import Distribution, Option, Question


def choice(names: list[str], min_confidence: float | None = None) -> Question:
    return Question("q", "choice", "pick", tuple(Option(n) for n in names), min_confidence=min_confidence)


def score(levels: list[str]) -> Question:
    return Question("s", "score", "rate", tuple(Option(str(i), d) for i, d in enumerate(levels)))


NOUL = Question("n", "noul", "is it?", (Option("true"), Option("false")))


def test_confidence_formula_matches_hosted_numbers() -> None:
    assert confidence([0.88, 0.12, 0.0]) == pytest.approx((0.88 - 1 / 3) / (1 - 1 / 3))
    assert confidence([0.5, 0.5]) == 0.0
    assert confidence([1.0]) == 1.0
    assert confidence([0.2, 0.2, 0.2, 0.2, 0.2]) == pytest.approx(0.0)


def test_noul_answer_has_no_confidence() -> None:
    answer = build_answer(NOUL, Distribution((0.95, 0.05)))
    assert answer == {"type": "noul", "noul": 0.95}


def test_choice_answer_keeps_criteria_order_and_argmax() -> None:
    answer = build_answer(choice(["billing", "technical", "sales"]), Distribution((0.12, 0.88, 0.0)))
    assert answer["choice"] == "technical"
    assert list(answer["probabilities"]) == ["billing", "technical", "sales"]  # type: ignore[arg-type]
    assert list(answer) == ["type", "choice", "confidence", "probabilities"]


def test_choice_tie_goes_to_first_option() -> None:
    assert build_answer(choice(["a", "b"]), Distribution((0.5, 0.5)))["choice"] == "a"


def test_score_is_expected_level_with_legend_as_sent() -> None:
    question = score(["Calm", "Frustrated", "Very angry"])
    answer = build_answer(question, Distribution((0.0, 0.95, 0.05)))
    assert answer["score"] == pytest.approx(1.05)
    assert answer["legend"] == {"0": "Calm", "1": "Frustrated", "2": "Very angry"}
    assert answer["probabilities"] == {"0": 0.0, "1": 0.95, "2": 0.05}
    assert answer["confidence"] == pytest.approx((0.95 - 1 / 3) / (2 / 3))


def test_rounding_happens_after_the_score_is_computed() -> None:
    question = score(["a", "b"])
    answer = build_answer(question, Distribution((0.494, 0.506)), decimals=2)
    assert answer["probabilities"] == {"0": 0.49, "1": 0.51}
    assert answer["score"] == 0.51  # round(0.506), not 0*0.49 + 1*0.51 computed after rounding
    full = build_answer(question, Distribution((0.494, 0.506)))
    assert full["score"] == pytest.approx(0.506)


def test_min_confidence_marks_abstention_but_keeps_probabilities() -> None:
    answer = build_answer(choice(["a", "b"], min_confidence=0.9), Distribution((0.6, 0.4)))
    assert answer["abstain"] is True
    assert answer["probabilities"] == {"a": 0.6, "b": 0.4}
    assert build_answer(choice(["a", "b"], min_confidence=0.1), Distribution((0.6, 0.4)))["abstain"] is False


@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=12))
def test_answers_are_well_formed_for_any_distribution(weights: list[float]) -> None:
    total = sum(weights)
    probabilities = tuple(w / total for w in weights)
    names = [f"o{i}" for i in range(len(weights))]
    c = build_answer(choice(names), Distribution(probabilities))
    assert math.isclose(sum(c["probabilities"].values()), 1.0, rel_tol=1e-9)  # type: ignore[union-attr]
    assert 0.0 <= c["confidence"] <= 1.0  # type: ignore[operator]
    s = build_answer(score(names), Distribution(probabilities))
    assert 0.0 <= s["score"] <= len(names) - 1 + 1e-9  # type: ignore[operator]
    assert s["score"] == pytest.approx(expected_score(probabilities))
