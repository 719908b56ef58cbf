"""`canvasread eval --compare`: two configurations on the same labelled decisions, paired bootstrap differences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from canvasread.cli import app
from canvasread.eval.compare import Configuration, paired_differences, verdict

TEAMS = {"billing": "charges, refunds", "technical": "bugs, outages", "sales": "orders, quotes"}
TICKETS = [
    ("I was charged twice for my order", "billing"),
    ("The app crashes when I log in", "technical"),
    ("Can I get a quote for 40 seats?", "sales"),
    ("Refund my last payment please", "billing"),
    ("Your site is down again", "technical"),
    ("I want to buy the premium plan", "sales"),
]


def write_data(folder: Path) -> Path:
    lines: list[dict[str, Any]] = []
    for index, (text, team) in enumerate(TICKETS):
        question = {"type": "choice", "instructions": "Which team should handle this?", "criteria": TEAMS}
        lines.append({"id": f"t{index}", "state": text, "question": question, "expected": team})
        noul = {"type": "noul", "instructions": "Is the customer asking for money back?"}
        lines.append({"id": f"r{index}", "state": text, "question": noul, "expected": str(team == "billing").lower()})
    path = folder / "decisions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_compare(data: Path, out: Path, first: str, second: str) -> dict[str, Any]:
    args = ["eval", str(data), "--compare", first, "--compare", second, "--out", str(out), "--resamples", "200"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads((out / "compare.json").read_text())
    assert (out / "compare.md").read_text().startswith(f"# {first} (A) vs {second} (B)")
    return report


def test_identical_answers_differ_by_nothing() -> None:
    answers = [(0.7, 0.3), (0.2, 0.8), (0.5, 0.5)]
    for name, difference in paired_differences(answers, answers, [0, 1, 1], resamples=50).items():
        assert (difference.estimate, difference.low, difference.high) == (0.0, 0.0, 0.0)
        assert verdict(name, difference) == "no clear difference"


def test_a_clearly_better_configuration_wins_every_metric() -> None:
    expected = [i % 3 for i in range(60)]
    guess = [(1 / 3, 1 / 3, 1 / 3)] * 60
    right = [tuple(0.9 if j == e else 0.05 for j in range(3)) for e in expected]
    differences = paired_differences(guess, right, expected, resamples=300, seed=1)
    assert differences["accuracy"].low > 0 and verdict("accuracy", differences["accuracy"]) == "B better"
    assert differences["log_loss"].high < 0 and verdict("log_loss", differences["log_loss"]) == "B better"


def test_configurations_parse_as_documented() -> None:
    assert Configuration.parse("http://127.0.0.1:8011", "dgemma") == Configuration(
        "http://127.0.0.1:8011", "dgemma", url="http://127.0.0.1:8011"
    )
    assert Configuration.parse("/m/dg@thought-on-canvas").layout == "thought-on-canvas"
    assert Configuration.parse("default") == Configuration("default", "default")
    with pytest.raises(ValueError, match="MODEL@LAYOUT"):
        Configuration.parse("/m/dg@")


def test_the_embedded_model_against_the_tiny_checkpoint(tmp_path: Path, tiny_checkpoint: Path) -> None:
    data = write_data(tmp_path)
    report = run_compare(data, tmp_path / "models", "default", str(tiny_checkpoint))
    assert report["paired"] == report["decisions"] == 2 * len(TICKETS)
    assert report["a"]["label"] == "default" and report["b"]["label"] == str(tiny_checkpoint)
    for name, entry in report["differences"].items():
        b_minus_a = report["b"]["metrics"][name] - report["a"]["metrics"][name]
        assert entry["b_minus_a"] == pytest.approx(b_minus_a)
        assert entry["ci_low"] <= entry["b_minus_a"] <= entry["ci_high"]
    single = CliRunner().invoke(app, ["eval", str(data), "--out", str(tmp_path / "one")])
    assert single.exit_code == 0, single.output
    alone = json.loads((tmp_path / "one" / "report.json").read_text())
    assert report["a"]["metrics"]["accuracy"] == pytest.approx(alone["accuracy"])
    assert report["a"]["metrics"]["log_loss"] == pytest.approx(alone["log_loss"])


def test_two_read_layouts_of_one_checkpoint(tmp_path: Path, tiny_checkpoint: Path) -> None:
    report = run_compare(
        write_data(tmp_path), tmp_path / "layouts", f"{tiny_checkpoint}@default", f"{tiny_checkpoint}@thought-on-canvas"
    )
    assert report["paired"] == 2 * len(TICKETS)
    assert report["a"]["metrics"]["log_loss"] != report["b"]["metrics"]["log_loss"], "layouts change the reads"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "default"], "exactly two"),
        (["--compare", "default@thought-on-canvas", "--compare", "default"], "no read layout"),
        (["--compare", "x@nonsense", "--compare", "default"], "unknown read layout"),
    ],
)
def test_compare_mistakes_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["eval", str(write_data(tmp_path)), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
