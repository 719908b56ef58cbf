"""The eval metrics and report sections, on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from canvasread.eval import metrics
from canvasread.eval.dataset import parse_item
from canvasread.eval.report import abstentions, order_stability
from canvasread.eval.runner import Outcome

READS = [(0.9, 0.1), (0.8, 0.2), (0.6, 0.4), (0.3, 0.7)]
EXPECTED = [0, 1, 0, 1]


def test_accuracy_brier_and_log_loss() -> None:
    assert metrics.accuracy(READS, EXPECTED) == 0.75
    # (0.1² + 0.1²) + (0.8² + 0.8²) + (0.4² + 0.4²) + (0.3² + 0.3²) = 1.8, over 4 answers
    assert metrics.brier(READS, EXPECTED) == pytest.approx(0.45)
    assert metrics.log_loss(READS, EXPECTED) == pytest.approx(-(math.log(0.9 * 0.2 * 0.6 * 0.7)) / 4)
    assert metrics.log_loss([(1.0, 0.0)], [1]) == pytest.approx(-math.log(1e-12))


def test_ece_uses_ten_equal_width_bins_of_top_label_confidence() -> None:
    bins = metrics.reliability(READS, EXPECTED)
    assert [b.count for b in bins] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert (bins[8].accuracy, bins[8].confidence) == (0.0, 0.8)
    # |1 − 0.6| + |1 − 0.7| + |0 − 0.8| + |1 − 0.9|, over 4 answers
    assert metrics.ece(READS, EXPECTED) == pytest.approx(0.4)
    assert metrics.reliability([(1.0, 0.0)], [0])[-1].count == 1
    assert [b.lower for b in bins] == pytest.approx([i / 10 for i in range(10)])


def test_ties_count_for_the_earliest_option_as_the_api_answers() -> None:
    assert metrics.accuracy([(0.5, 0.5)], [0]) == 1.0
    assert not metrics.flipped((0.5, 0.5), (0.5, 0.5))
    assert metrics.flipped((0.6, 0.4), (0.4, 0.6))


def test_total_variation_and_percentiles() -> None:
    assert metrics.total_variation((0.5, 0.5), (0.8, 0.2)) == pytest.approx(0.3)
    assert metrics.quantile([0.001, 0.002, 0.003], 0.5) * 1000 == pytest.approx(2.0)


def _outcome(number: int, first: tuple[float, ...], *again: tuple[float, ...], abstain: bool = False) -> Outcome:
    line = {
        "id": str(number),
        "state": "s",
        "question": {"type": "choice", "criteria": {"a": 1, "b": 2}},
        "expected": "a",
    }
    return Outcome(parse_item(line, "test"), first, 0.01, abstain, again)


def test_order_stability_counts_each_reask() -> None:
    outcomes = [
        _outcome(1, (0.6, 0.4), (0.4, 0.6), (0.6, 0.4)),
        _outcome(2, (0.9, 0.1), (0.9, 0.1), (0.8, 0.2)),
        _outcome(3, (0.7, 0.3)),
    ]
    report = order_stability(outcomes)
    assert report["order_checked"] == 2
    assert report["flip_rate"] == 0.25
    assert (report["flip_rate_reversed"], report["flip_rate_shuffled"]) == (0.5, 0.0)
    assert report["items_flipped"] == 1
    assert report["mean_probability_shift"] == pytest.approx((0.2 + 0.0 + 0.0 + 0.1) / 4)


def test_abstentions_and_accuracy_on_the_rest() -> None:
    outcomes = [_outcome(1, (0.9, 0.1)), _outcome(2, (0.2, 0.8)), _outcome(3, (0.55, 0.45), abstain=True)]
    assert abstentions(outcomes) == {"abstentions": 1, "abstain_rate": 1 / 3, "accuracy_when_answered": 0.5}
