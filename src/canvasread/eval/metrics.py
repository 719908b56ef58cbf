"""Scores for labelled probabilistic answers: accuracy, ECE, Brier, log loss, order stability, latency.

Pure functions of probabilities and expected indices (numpy only), shared by
`eval` and `calibrate` so a number means the same thing in both reports.
Distributions may have different lengths (a dataset can mix question types).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from canvasread.calibration import PROBABILITY_FLOOR
from canvasread.kinds.base import top_index

Probabilities = Sequence[float]
ECE_BINS = 10


@dataclass(frozen=True)
class ReliabilityBin:
    """One equal-width bin of top-label confidence: [lower, upper), the last one closed."""

    lower: float
    upper: float
    count: int
    accuracy: float | None
    confidence: float | None


def accuracy(distributions: Sequence[Probabilities], expected: Sequence[int]) -> float:
    """Share of answers whose top option (ties: the earliest, as the API answers) is the expected one."""
    return float(np.mean([top_index(p) == e for p, e in zip(distributions, expected, strict=True)]))


def reliability(
    distributions: Sequence[Probabilities], expected: Sequence[int], bins: int = ECE_BINS
) -> list[ReliabilityBin]:
    """Top-label confidence (max p) against accuracy, in `bins` equal-width bins over [0, 1]."""
    confidence = np.array([max(p) for p in distributions])
    correct = np.array([top_index(p) == e for p, e in zip(distributions, expected, strict=True)], dtype=float)
    index = np.minimum((confidence * bins).astype(int), bins - 1)
    result = []
    for b in range(bins):
        members = index == b
        count = int(members.sum())
        result.append(
            ReliabilityBin(
                b / bins,
                (b + 1) / bins,
                count,
                float(correct[members].mean()) if count else None,
                float(confidence[members].mean()) if count else None,
            )
        )
    return result


def expected_calibration_error(bins: Sequence[ReliabilityBin]) -> float:
    """ECE: the count-weighted mean gap |accuracy − confidence| over the bins."""
    total = sum(b.count for b in bins)
    return sum(
        b.count / total * abs(b.accuracy - b.confidence)
        for b in bins
        if b.accuracy is not None and b.confidence is not None
    )


def ece(distributions: Sequence[Probabilities], expected: Sequence[int], bins: int = ECE_BINS) -> float:
    return expected_calibration_error(reliability(distributions, expected, bins))


def brier(distributions: Sequence[Probabilities], expected: Sequence[int]) -> float:
    """Mean over answers of Σ_i (p_i − y_i)², the multi-class Brier score (0 best, 2 worst)."""
    scores = []
    for probabilities, answer in zip(distributions, expected, strict=True):
        target = np.zeros(len(probabilities))
        target[answer] = 1.0
        scores.append(float(np.sum((np.asarray(probabilities) - target) ** 2)))
    return float(np.mean(scores))


def log_loss(distributions: Sequence[Probabilities], expected: Sequence[int]) -> float:
    """Mean −ln p(expected), with p clipped at `PROBABILITY_FLOOR` (the floor calibration fits with)."""
    return float(
        np.mean([-math.log(max(p[e], PROBABILITY_FLOOR)) for p, e in zip(distributions, expected, strict=True)])
    )


def total_variation(first: Probabilities, second: Probabilities) -> float:
    """½ Σ |p_i − q_i|: how much probability moved between two reads of the same options (0..1)."""
    return 0.5 * float(np.sum(np.abs(np.asarray(first) - np.asarray(second))))


def flipped(first: Probabilities, second: Probabilities) -> bool:
    """Whether two reads (both in the caller's option order) pick different top options."""
    return top_index(first) != top_index(second)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 ≤ q ≤ 1), interpolated linearly between closest ranks (numpy's default, "inclusive").

    The one quantile of the package: eval reports, the bench and the load generator all use it.
    """
    if not values:
        raise ValueError("the quantile of no values is undefined")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
