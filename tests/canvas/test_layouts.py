"""Read layouts are chosen per server, reported in diagnostics, and part of the calibration fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from canvasread.calibration import Calibration
from canvasread.canvas.backend import CanvasBackend, ReadSettings
from canvasread.canvas.layouts import LAYOUTS, layout_named
from canvasread.catalog import open_decider
from canvasread.cli import app
from canvasread.decide import Decider
from canvasread.errors import CalibrationMismatch

QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for money back?"}}


def fingerprint(decider: Decider) -> str:
    backend = decider.served[0].backend
    assert isinstance(backend, CanvasBackend) and backend.fingerprint is not None
    return backend.fingerprint


def test_a_layout_is_reported_and_fingerprinted(tiny_checkpoint: Path, tiny_decider: Decider) -> None:
    other = open_decider((str(tiny_checkpoint),), reading=ReadSettings(layout=layout_named("thought-on-canvas")))
    moved = other.ask("charged twice", QUESTIONS, seed=1, samples=1, diagnostics=True)["answers"]["refund"]  # type: ignore[index]
    usual = tiny_decider.ask("charged twice", QUESTIONS, seed=1, samples=1, diagnostics=True)["answers"]["refund"]  # type: ignore[index]
    assert moved["diagnostics"]["layout"] == "thought-on-canvas" and usual["diagnostics"]["layout"] == "default"
    assert moved["noul"] != usual["noul"]
    assert fingerprint(other) != fingerprint(tiny_decider)
    name = other.served[0].card.name
    with pytest.raises(CalibrationMismatch):
        other.use_calibration(Calibration(name, fingerprint(tiny_decider), {}))
    other.use_calibration(Calibration(name, fingerprint(other), {}))


def test_every_layout_has_a_distinct_description() -> None:
    described = [tuple(sorted(layout.describe().items())) for layout in LAYOUTS.values()]
    assert len(set(described)) == len(LAYOUTS)
    assert all(layout.describe()["name"] == name for name, layout in LAYOUTS.items())


def test_serve_refuses_an_unknown_layout_in_one_line() -> None:
    result = CliRunner().invoke(app, ["serve", "--layout", "sideways"])
    assert result.exit_code == 1
    assert "unknown read layout 'sideways'" in result.output and "default" in result.output
