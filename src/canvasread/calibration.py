"""Temperature scaling: fit, apply, load and save per-model temperature maps.

A decision model's probabilities are useful only if 0.9 means right 9 times
in 10. One temperature per (question type, option-count bucket) is the
smallest fix that keeps the argmax (so accuracy cannot change) and is hard to
overfit. A calibration file names the model and a fingerprint of its weights
and config, so a file fit for one model is never applied to another.

Pure math on floats and numpy arrays: no torch, no HTTP.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from canvasread.kinds import kind_of
from canvasread.types import Distribution, Question

FORMAT = "canvasread-calibration/1"
# Probabilities are clipped here before taking logs, so a read that put exactly
# zero on the right answer costs a large but finite log loss.
PROBABILITY_FLOOR = 1e-12
# The search range for T: beyond it a read is either a one-hot or uniform, and
# a fit that wants more than that says the model is broken, not miscalibrated.
MIN_TEMPERATURE = 0.05
MAX_TEMPERATURE = 20.0
# Golden-section steps on log T: each keeps 61.8% of the bracket, so 60 steps
# narrow ln(400) ≈ 6 to ~1e-12, far below anything that moves an answer.
SEARCH_STEPS = 60


def bucket(kind: str, option_count: int) -> str | None:
    """The calibration bucket of a question: its kind's, by option count (None: that kind is never calibrated).

    Overconfidence grows with the number of options, so each kind buckets its option counts
    (`canvasread.kinds.base.option_bucket`: 3 and 77 options get different temperatures).
    """
    return kind_of(kind).bucket(option_count)


def temper(probabilities: Sequence[float], temperature: float) -> tuple[float, ...]:
    """softmax(log p / T), normalised with `math.fsum` (exactly rounded, so independent of option order)."""
    logits = [math.log(max(p, PROBABILITY_FLOOR)) / temperature for p in probabilities]
    top = max(logits)
    weights = [math.exp(z - top) for z in logits]
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


def _mean_log_loss(logits: np.ndarray, expected: np.ndarray, temperature: float) -> float:
    """Mean −log softmax(logits / T)[expected]; rows are padded with −inf past their option count."""
    scaled = logits / temperature
    top = scaled.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(scaled - top).sum(axis=1)) + top[:, 0]
    picked = scaled[np.arange(len(expected)), expected]
    return float(np.mean(log_norm - picked))


def _padded_logits(distributions: Sequence[Sequence[float]]) -> np.ndarray:
    width = max(len(p) for p in distributions)
    logits = np.full((len(distributions), width), -np.inf)
    for row, probabilities in enumerate(distributions):
        logits[row, : len(probabilities)] = np.log(
            np.clip(np.asarray(probabilities, dtype=float), PROBABILITY_FLOOR, 1)
        )
    return logits


def fit_temperature(distributions: Sequence[Sequence[float]], expected: Sequence[int]) -> float:
    """The T in [MIN_TEMPERATURE, MAX_TEMPERATURE] that minimises the mean log loss of `temper(p, T)`.

    Log loss is convex in 1/T, hence unimodal in log T, so a golden-section
    search on log T finds the global minimum without scipy.
    """
    if not distributions or len(distributions) != len(expected):
        raise ValueError("fitting needs one expected index per distribution, and at least one of each")
    logits = _padded_logits(distributions)
    targets = np.asarray(expected, dtype=int)
    low, high = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    ratio = (math.sqrt(5) - 1) / 2
    left, right = high - ratio * (high - low), low + ratio * (high - low)
    loss_left = _mean_log_loss(logits, targets, math.exp(left))
    loss_right = _mean_log_loss(logits, targets, math.exp(right))
    for _ in range(SEARCH_STEPS):
        if loss_left <= loss_right:
            high, right, loss_right = right, left, loss_left
            left = high - ratio * (high - low)
            loss_left = _mean_log_loss(logits, targets, math.exp(left))
        else:
            low, left, loss_left = left, right, loss_right
            right = low + ratio * (high - low)
            loss_right = _mean_log_loss(logits, targets, math.exp(right))
    return math.exp((low + high) / 2)


@dataclass(frozen=True)
class Calibration:
    """Temperatures for one model, keyed by `bucket(...)`; `fit` records how they were made (data, split, ECE)."""

    model: str
    fingerprint: str
    temperatures: Mapping[str, float]
    fit: Mapping[str, Any] = field(default_factory=dict)

    def temperature_for(self, kind: str, option_count: int) -> float | None:
        """The fitted temperature, or None where no bucket was fit (the answer then stays uncalibrated)."""
        key = bucket(kind, option_count)
        return None if key is None else self.temperatures.get(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "method": "temperature",
            "temperatures": dict(self.temperatures),
            "fit": dict(self.fit),
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read a calibration file; raises ValueError naming the file when it is not one."""
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
            temperatures = {str(k): float(v) for k, v in data["temperatures"].items()}
            if not all(MIN_TEMPERATURE <= t <= MAX_TEMPERATURE for t in temperatures.values()):
                raise ValueError(f"temperatures must lie in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]")
            return cls(str(data["model"]), str(data["fingerprint"]), temperatures, dict(data.get("fit", {})))
        except (OSError, KeyError, TypeError, AttributeError, json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"{path} is not a canvasread calibration file: {error}") from None


def calibrate(calibration: Calibration | None, question: Question, distribution: Distribution) -> Distribution:
    """Apply the question's bucket temperature, and say in the details whether it was applied and which."""
    temperature = None
    if calibration is not None:
        temperature = calibration.temperature_for(question.kind, len(question.options))
    if temperature is None:  # kinds without a bucket (answered without options) pass through
        return replace(distribution, details={**distribution.details, "calibrated": False})
    return replace(
        distribution,
        probabilities=temper(distribution.probabilities, temperature),
        details={**distribution.details, "calibrated": True, "temperature": temperature},
    )
