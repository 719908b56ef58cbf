"""Readout math: from slot log-probabilities to answer distributions, and when to read again.

Pure Python (no numpy, no torch) so it is trivially testable and shared by
every reader.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotReading:
    """One read of one slot, restricted to the question's labels.

    `probabilities` is renormalised over the labels; `label_mass` is the share
    of the full-vocabulary probability that fell on them (renormalisation hides
    off-label mass, so it is reported rather than thrown away).
    """

    probabilities: tuple[float, ...]
    label_mass: float


def slot_reading(label_logprobs: Sequence[float], other_forms: Sequence[float | None] = ()) -> SlotReading:
    """Renormalise label log-probabilities, stably (shift by the max before exponentiating).

    With `other_forms` (a label's other whitespace form, None where it has none) a label scores the larger of
    its two forms and both count towards the label mass, as vLLM 0.33's DiffusionGemma reader does.
    """
    others = [*other_forms, *([None] * (len(label_logprobs) - len(other_forms)))]
    scores = [lp if other is None else max(lp, other) for lp, other in zip(label_logprobs, others, strict=True)]
    top = max(scores)
    weights = [math.exp(lp - top) for lp in scores]
    total = sum(weights)
    everything = [*label_logprobs, *(other for other in other_forms if other is not None)]
    mass = sum(math.exp(lp) for lp in everything)
    return SlotReading(tuple(w / total for w in weights), min(1.0, mass))


def normalised_entropy(probabilities: Sequence[float]) -> float:
    """Shannon entropy divided by log k: 0 for a certain answer, 1 for a uniform one (0 when k = 1)."""
    k = len(probabilities)
    if k <= 1:
        return 0.0
    entropy = -sum(p * math.log(p) for p in probabilities if p > 0.0)
    return min(1.0, entropy / math.log(k))


@dataclass(frozen=True)
class Combined:
    """Several reads of one slot averaged: the answer distribution and its uncertainty."""

    probabilities: tuple[float, ...]
    standard_errors: tuple[float, ...]
    agreement: float
    label_mass: float
    reads: int


def combine(readings: Sequence[SlotReading]) -> Combined:
    """Mean distribution over reads; per-option standard error of the mean; share of reads agreeing on the top."""
    n = len(readings)
    k = len(readings[0].probabilities)
    means = tuple(sum(r.probabilities[i] for r in readings) / n for i in range(k))
    if n > 1:
        errors = tuple(
            math.sqrt(sum((r.probabilities[i] - means[i]) ** 2 for r in readings) / (n - 1) / n) for i in range(k)
        )
    else:
        errors = tuple(0.0 for _ in range(k))
    top = max(range(k), key=lambda i: means[i])
    agreeing = sum(1 for r in readings if max(range(k), key=lambda i: r.probabilities[i]) == top)
    return Combined(means, errors, agreeing / n, sum(r.label_mass for r in readings) / n, n)


def needs_another_read(readings: Sequence[SlotReading], *, entropy_threshold: float, max_reads: int) -> bool:
    """The `samples: "auto"` rule: read again while the averaged label distribution is uncertain.

    Uncertainty is judged on the label distribution (normalised entropy), not
    on the whole vocabulary, where nearly every read would look uncertain.
    """
    if len(readings) >= max_reads:
        return False
    return normalised_entropy(combine(readings).probabilities) > entropy_threshold
