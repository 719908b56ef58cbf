"""The escalation sweep: at each threshold the first model's answers where it is sure enough, else the target's."""

from __future__ import annotations

import pytest

from canvasread.eval.dataset import EvalItem
from canvasread.eval.escalation import THRESHOLDS, confidence, markdown, sweep
from canvasread.eval.runner import Outcome


def outcome(index: int, probabilities: tuple[float, ...]) -> Outcome:
    item = EvalItem(f"d{index}", "state", {"type": "choice"}, "a", "choice", ("a", "b"))
    return Outcome(item, probabilities, 0.01, False)


def test_the_sweep_mixes_answers_by_the_first_models_confidence() -> None:
    first = [outcome(0, (0.9, 0.1)), outcome(1, (0.4, 0.6)), outcome(2, (0.55, 0.45))]
    second = [outcome(0, (0.2, 0.8)), outcome(1, (1.0, 0.0)), outcome(2, (1.0, 0.0))]
    assert [confidence(o) for o in first] == pytest.approx([0.8, 0.2, 0.1])
    report = sweep(first, second, "small", "big", thresholds=(0.0, 0.15, 0.5, 1.0))
    rows = {row["below"]: row for row in report["thresholds"]}
    assert rows[0.0]["escalated"] == 0 and rows[0.0]["accuracy"] == pytest.approx(2 / 3)
    assert rows[0.15]["escalated"] == 1 and rows[0.15]["accuracy"] == pytest.approx(2 / 3)
    assert rows[0.5]["escalated"] == 2 and rows[0.5]["accuracy"] == pytest.approx(1.0)
    assert rows[1.0]["share_escalated"] == 1.0 and rows[1.0]["accuracy"] == pytest.approx(2 / 3)
    assert report["target_alone"]["accuracy"] == pytest.approx(2 / 3)
    assert "| 0.50 | 2 |" in markdown(report)
    assert THRESHOLDS[0] == 0 and THRESHOLDS[-1] == 1 and len(THRESHOLDS) == 21


def test_decisions_one_run_failed_are_left_out() -> None:
    report = sweep([outcome(0, (0.9, 0.1)), outcome(1, (0.9, 0.1))], [outcome(1, (0.1, 0.9))], "small", "big")
    assert report["n"] == 1
    with pytest.raises(ValueError, match="no decision was answered by both"):
        sweep([outcome(0, (0.9, 0.1))], [], "small", "big")
