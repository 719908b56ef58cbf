"""`canvasread calibrate`: fit one temperature per (question type, option-count bucket) and prove it on held-out data.

The labelled decisions are split by a hash of their id (stable across runs and
machines, no shuffling state), temperatures are fit on one part by minimising
log loss, and ECE, log loss and Brier are reported before and after on the
part the fit never saw.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from canvasread.calibration import Calibration, bucket, fit_temperature, temper
from canvasread.eval.report import scores
from canvasread.eval.runner import Outcome

# Below this many decisions a bucket's temperature is mostly noise; such
# buckets stay uncalibrated (answers say `"calibrated": false`).
MIN_FIT_DECISIONS = 20


def held_out(item_id: str, share: float, seed: int) -> bool:
    """Whether a decision belongs to the held-out split: the top 64 bits of sha256(seed:id) as a fraction."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _bucket_of(outcome: Outcome) -> str:
    name = bucket(outcome.item.kind, len(outcome.item.options))
    assert name is not None, "an evaluation item has options, and every kind answered with options has a bucket"
    return name


def _comparison(before: Sequence[Outcome], after: Sequence[Outcome]) -> dict[str, Any]:
    """Held-out numbers before and after temperature scaling (accuracy cannot change: T keeps the argmax)."""
    if not before:
        return {"n": 0}
    raw, tempered = scores(before), scores(after)
    result: dict[str, Any] = {"n": raw["n"], "accuracy": raw["accuracy"]}
    for key in ("ece", "log_loss", "brier"):
        result[f"{key}_before"] = raw[key]
        result[f"{key}_after"] = tempered[key]
    return result


def fit_calibration(
    outcomes: Sequence[Outcome],
    model: str,
    fingerprint: str,
    *,
    holdout: float,
    seed: int,
    run: Mapping[str, Any],
) -> Calibration:
    """Fit per-bucket temperatures on the fit split; `fit` records the held-out comparison and how it was made."""
    temperatures: dict[str, float] = {}
    buckets: dict[str, Any] = {}
    for name in sorted({_bucket_of(o) for o in outcomes}):
        members = [o for o in outcomes if _bucket_of(o) == name]
        fit_part = [o for o in members if not held_out(o.item.id, holdout, seed)]
        test_part = [o for o in members if held_out(o.item.id, holdout, seed)]
        entry: dict[str, Any] = {"n_fit": len(fit_part), "n_held_out": len(test_part), "temperature": None}
        if len(fit_part) >= MIN_FIT_DECISIONS:
            temperature = fit_temperature(
                [o.probabilities for o in fit_part], [o.item.expected_index for o in fit_part]
            )
            temperatures[name] = temperature
            entry["temperature"] = temperature
        buckets[name] = entry
    calibration = Calibration(model, fingerprint, temperatures)
    before = [o for o in outcomes if held_out(o.item.id, holdout, seed)]
    after = [_tempered(o, calibration) for o in before]
    for name, entry in buckets.items():
        entry["held_out"] = _comparison(
            [o for o in before if _bucket_of(o) == name], [o for o in after if _bucket_of(o) == name]
        )
    fit = {**run, "holdout": holdout, "seed": seed, "held_out": _comparison(before, after), "buckets": buckets}
    return replace(calibration, fit=fit)


def _tempered(outcome: Outcome, calibration: Calibration) -> Outcome:
    temperature = calibration.temperature_for(outcome.item.kind, len(outcome.item.options))
    if temperature is None:
        return outcome
    return replace(outcome, probabilities=temper(outcome.probabilities, temperature))
