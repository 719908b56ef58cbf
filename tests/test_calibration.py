"""Temperature scaling: the math, the file, and its checks against the served model (library, CLI, live server)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import free_port, serve_cli

from canvasread.backends.base import FunctionBackend
from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL, SparrowBackend
from canvasread.calibration import Calibration, bucket, fit_temperature, temper
from canvasread.decide import Decider
from canvasread.errors import CalibrationMismatch


def test_buckets_group_option_counts_by_powers_of_two() -> None:
    assert bucket("noul", 2) == "noul"
    assert bucket("choice", 2) == "choice/2"
    assert [bucket("choice", k) for k in (3, 4, 5, 8, 9, 77, 128, 129, 255)] == [
        "choice/3-4",
        "choice/3-4",
        "choice/5-8",
        "choice/5-8",
        "choice/9-16",
        "choice/65-128",
        "choice/65-128",
        "choice/129-256",
        "choice/129-256",
    ]
    assert bucket("score", 10) == "score/9-16"


def test_temper_keeps_the_argmax_and_sharpens_or_flattens() -> None:
    p = (0.5, 0.3, 0.2)
    assert temper(p, 1.0) == pytest.approx(p, abs=1e-15)
    sharp, flat = temper(p, 0.5), temper(p, 4.0)
    assert math.fsum(sharp) == pytest.approx(1.0) and math.fsum(flat) == pytest.approx(1.0)
    assert sharp[0] > 0.5 > flat[0] > flat[1] > flat[2]
    assert sharp == pytest.approx((0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38))


def test_temper_does_not_depend_on_option_order() -> None:
    p = [0.1, 0.2, 0.3, 0.15, 0.25, 1e-9, 0.0]
    reference = dict(zip(range(len(p)), temper(p, 1.7), strict=True))
    for shift in range(1, len(p)):
        order = list(range(shift, len(p))) + list(range(shift))
        shifted = temper([p[i] for i in order], 1.7)
        assert dict(zip(order, shifted, strict=True)) == reference


def _sampled(true_temperature: float, count: int, options: int, seed: int) -> tuple[list[list[float]], list[int]]:
    """Model reads softmax(z) whose labels are really drawn from softmax(z / true_temperature)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, size=(count, options))
    reads = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    truth = np.exp(logits / true_temperature) / np.exp(logits / true_temperature).sum(axis=1, keepdims=True)
    labels = [int(rng.choice(options, p=row)) for row in truth]
    return reads.tolist(), labels


@pytest.mark.parametrize("true_temperature", [0.5, 1.0, 2.5])
def test_fit_recovers_the_temperature_that_generated_the_labels(true_temperature: float) -> None:
    reads, labels = _sampled(true_temperature, 4000, 6, seed=7)
    assert fit_temperature(reads, labels) == pytest.approx(true_temperature, rel=0.12)


def test_fit_minimises_log_loss_against_a_grid() -> None:
    reads, labels = _sampled(1.8, 600, 4, seed=3)

    def loss(t: float) -> float:
        return -float(np.mean([math.log(temper(r, t)[y]) for r, y in zip(reads, labels, strict=True)]))

    best = fit_temperature(reads, labels)
    assert all(loss(best) <= loss(t) + 1e-9 for t in np.linspace(0.3, 6.0, 60))


def test_fit_handles_mixed_option_counts_and_zero_probabilities() -> None:
    reads: list[Sequence[float]] = [(1.0, 0.0), (0.7, 0.2, 0.1), (0.0, 1.0, 0.0, 0.0)]
    temperature = fit_temperature(reads, [1, 0, 1])
    assert 0.05 <= temperature <= 20.0 and math.isfinite(temperature)


def test_calibration_file_round_trip_and_clear_errors(tmp_path: Path) -> None:
    calibration = Calibration("m", "sha256:ab", {"choice/3-4": 1.25}, {"held_out": {"n": 3}})
    path = tmp_path / "calibration.json"
    calibration.save(path)
    assert Calibration.load(path) == calibration
    assert calibration.temperature_for("choice", 4) == 1.25
    assert calibration.temperature_for("choice", 5) is None
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not a canvasread calibration file"):
        Calibration.load(path)


class FingerprintedBackend(FunctionBackend):
    """Knows its fingerprint from the start, or (like the canvas backend) only once loaded."""

    def __init__(self, fingerprint: str, *, known_before_load: bool = True) -> None:
        super().__init__(lambda request: [(0.6, 0.3, 0.1) for _ in request.questions], name="fn")
        self._fingerprint = fingerprint
        self._known = known_before_load

    @property
    def fingerprint(self) -> str | None:
        return self._fingerprint if self._known else None

    def load(self) -> None:
        self._known = True


def _ask_team(decider: Decider) -> Any:
    questions = {"team": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}}
    return decider.ask("state", questions, diagnostics=True)["answers"]["team"]


def test_decider_applies_a_matching_calibration_and_says_so() -> None:
    decider = Decider([FingerprintedBackend("sha256:1")])
    decider.load()
    before = _ask_team(decider)
    assert before["diagnostics"] == {"calibrated": False}
    decider.use_calibration(Calibration("fn", "sha256:1", {"choice/3-4": 2.0}))
    after = _ask_team(decider)
    assert after["diagnostics"] == {"calibrated": True, "temperature": 2.0}
    assert list(after["probabilities"].values()) == pytest.approx(temper((0.6, 0.3, 0.1), 2.0))
    assert after["choice"] == before["choice"] == "a"


def test_decider_refuses_a_calibration_for_another_model_or_other_weights() -> None:
    decider = Decider([FingerprintedBackend("sha256:1")])
    with pytest.raises(CalibrationMismatch, match="'other', which is not served here"):
        decider.use_calibration(Calibration("other", "sha256:1", {}))
    with pytest.raises(CalibrationMismatch, match="fingerprint sha256:2, but the served weights/config have sha256:1"):
        decider.use_calibration(Calibration("fn", "sha256:2", {}))
    plain = Decider([FunctionBackend(lambda r: [(1.0,)], name="fn")])
    with pytest.raises(CalibrationMismatch, match="no fingerprint"):
        plain.use_calibration(Calibration("fn", "sha256:1", {}))
    assert all(served.calibration is None for served in [*decider.served, *plain.served])


def test_a_fingerprint_known_only_after_loading_is_checked_when_the_model_loads() -> None:
    wrong = Decider([FingerprintedBackend("sha256:1", known_before_load=False)])
    wrong.use_calibration(Calibration("fn", "sha256:2", {"choice/3-4": 2.0}))
    wrong.load()
    assert not wrong.ready
    assert "CalibrationMismatch" in wrong.not_ready_reasons()[0] and "refit it" in wrong.not_ready_reasons()[0]
    right = Decider([FingerprintedBackend("sha256:1", known_before_load=False)])
    right.use_calibration(Calibration("fn", "sha256:1", {"choice/3-4": 2.0}))
    right.load()
    assert right.ready and _ask_team(right)["diagnostics"] == {"calibrated": True, "temperature": 2.0}


def test_sparrow_fingerprint_hashes_the_model_file_and_tells_models_apart() -> None:
    general, robot = SparrowBackend(DEFAULT_SPARROW_MODEL), SparrowBackend("sparrow-nano-robot-v1.2")
    assert general.fingerprint.startswith("sha256:") and len(general.fingerprint) == 7 + 64
    assert general.fingerprint == SparrowBackend(DEFAULT_SPARROW_MODEL).fingerprint
    assert general.fingerprint != robot.fingerprint


def _sparrow_calibration(path: Path, fingerprint: str) -> Path:
    Calibration(DEFAULT_SPARROW_MODEL, fingerprint, {"choice/3-4": 0.5}).save(path)
    return path


def test_serve_applies_a_calibration_file(tmp_path: Path) -> None:
    path = _sparrow_calibration(tmp_path / "cal.json", SparrowBackend().fingerprint)
    body = {
        "model": "jev-latest",
        "state": "I was charged twice for my order",
        "diagnostics": True,
        "questions": {
            "team": {"type": "choice", "criteria": {"billing": None, "technical": None, "sales": None}},
            "refund": {"type": "noul", "instructions": "Is this about money?"},
        },
    }
    with serve_cli("--calibration", str(path)) as base:
        answers = httpx.post(base + "/v1/systemone", json=body, timeout=30).json()["answers"]
    assert answers["team"]["diagnostics"] == {"calibrated": True, "temperature": 0.5, "truncated": False}
    assert answers["refund"]["diagnostics"] == {"calibrated": False, "truncated": False}
    decider = Decider([SparrowBackend()])
    decider.load()
    raw = decider.ask(body["state"], body["questions"])["answers"]["team"]["probabilities"]
    assert list(answers["team"]["probabilities"].values()) == pytest.approx(temper(list(raw.values()), 0.5))


def test_serve_refuses_a_calibration_fit_for_other_weights(tmp_path: Path) -> None:
    path = _sparrow_calibration(tmp_path / "cal.json", "sha256:" + "0" * 64)
    command = [sys.executable, "-m", "canvasread", "serve", "--port", str(free_port()), "--calibration", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env={"COLUMNS": "200"})
    assert result.returncode == 1
    assert "refit it with `canvasread calibrate`" in result.stderr
