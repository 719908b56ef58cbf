"""The box kind: edges from tens and units digit slots on a grid of 100, their moments, the answer's shape."""

from __future__ import annotations

import pytest
from typesafe_sdk import BoxAnswer

from canvasread.answers import build_answer
from canvasread.kinds import box
from canvasread.kinds.box import box_confidence, box_edges
from canvasread.types import Distribution, Question


def one_hot(index: int, size: int = 10) -> tuple[float, ...]:
    return tuple(1.0 if i == index else 0.0 for i in range(size))


def test_edges_come_from_tens_and_units_digits_on_a_grid_of_100() -> None:
    digits = [one_hot(d) for d in (1, 2, 6, 6, 1, 9, 6, 8)]  # top 12, bottom 66, left 19, right 68
    edges = box.edge_distributions(digits)
    assert [len(edge) for edge in edges] == [100] * 4
    assert box_edges(edges) == pytest.approx({"top": 12 / 99, "bottom": 66 / 99, "left": 19 / 99, "right": 68 / 99})
    assert box_confidence(edges) == pytest.approx(1.0)
    # The expected value is 10·E[tens] + E[units], whatever the spread.
    tens, units = (0.0, 0.5, 0.5, *([0.0] * 7)), tuple(0.1 for _ in range(10))
    mean = (10 * 1.5 + 4.5) / 99
    assert box_edges(box.edge_distributions([tens, units] * 4))["top"] == pytest.approx(mean)


def test_uniform_reads_have_no_confidence_and_swapped_edges_are_put_in_order() -> None:
    uniform = tuple(0.1 for _ in range(10))
    assert box_confidence(box.edge_distributions([uniform] * 8)) == pytest.approx(0.0, abs=1e-12)
    swapped = box.edge_distributions([one_hot(d) for d in (8, 0, 2, 0, 9, 9, 0, 0)])  # top 80 > bottom 20
    question = Question("dog", "box", "the dog", ())
    answer = build_answer(question, Distribution((), edges=swapped), decimals=2)
    assert answer == {
        "type": "box",
        "box": {"top": 0.2, "bottom": 0.81, "left": 0.0, "right": 1.0},
        "confidence": 1.0,
    }
    BoxAnswer.model_validate(answer)  # the SDK's own model parses it
