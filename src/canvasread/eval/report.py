"""Turn a run into `report.json` and a markdown summary.

`report.json` keeps its headline numbers at the top level (`n`, `accuracy`,
`ece`, `brier`, `log_loss`, `latency_p50_ms`, `latency_p95_ms`, and with an
order check `flip_rate`, `mean_probability_shift`) so scripts can compare
runs without knowing the nesting; `run` says exactly how it was made.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from canvasread.eval import metrics
from canvasread.eval.runner import REORDERINGS, Outcome, RunResult


def scores(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Accuracy and calibration of a set of answered decisions."""
    distributions = [o.probabilities for o in outcomes]
    expected = [o.item.expected_index for o in outcomes]
    bins = metrics.reliability(distributions, expected)
    return {
        "n": len(expected),
        "accuracy": metrics.accuracy(distributions, expected),
        "ece": metrics.expected_calibration_error(bins),
        "brier": metrics.brier(distributions, expected),
        "log_loss": metrics.log_loss(distributions, expected),
        "ece_bins": [asdict(b) for b in bins],
    }


def abstentions(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """How many answers abstained (`min_confidence`), and how accurate the rest were."""
    answered = [o for o in outcomes if not o.abstain]
    return {
        "abstentions": len(outcomes) - len(answered),
        "abstain_rate": (len(outcomes) - len(answered)) / len(outcomes),
        "accuracy_when_answered": (
            metrics.accuracy([o.probabilities for o in answered], [o.item.expected_index for o in answered])
            if answered
            else None
        ),
    }


def order_stability(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Flip rate and mean total-variation shift of the re-asked (reversed, shuffled) reads against the first read."""
    checked = [o for o in outcomes if o.reordered]
    pairs = [(o.probabilities, again) for o in checked for again in o.reordered]
    if not pairs:
        return {"order_checked": 0, "flip_rate": None, "mean_probability_shift": None}
    result: dict[str, Any] = {
        "order_checked": len(checked),
        "flip_rate": sum(metrics.flipped(a, b) for a, b in pairs) / len(pairs),
        "mean_probability_shift": sum(metrics.total_variation(a, b) for a, b in pairs) / len(pairs),
        "items_flipped": sum(any(metrics.flipped(o.probabilities, b) for b in o.reordered) for o in checked),
    }
    for index, name in enumerate(REORDERINGS):
        result[f"flip_rate_{name}"] = sum(metrics.flipped(o.probabilities, o.reordered[index]) for o in checked) / len(
            checked
        )
    return result


def build_report(result: RunResult, run: Mapping[str, Any], order_check: bool) -> dict[str, Any]:
    """Every number of one run; `run` (command, data, model, settings) is stored as given."""
    outcomes = result.outcomes
    if not outcomes:
        raise ValueError(f"no decision was answered ({len(result.failures)} failed); nothing to report")
    latencies = [o.latency_s for o in outcomes]
    report: dict[str, Any] = {
        **scores(outcomes),
        "latency_p50_ms": metrics.quantile(latencies, 0.50) * 1000.0,
        "latency_p95_ms": metrics.quantile(latencies, 0.95) * 1000.0,
        **abstentions(outcomes),
        "errors": len(result.failures),
    }
    if order_check:
        report.update(order_stability(outcomes))
    kinds = sorted({o.item.kind for o in outcomes})
    if len(kinds) > 1:
        report["by_type"] = {
            kind: {k: v for k, v in scores([o for o in outcomes if o.item.kind == kind]).items() if k != "ece_bins"}
            for kind in kinds
        }
    report["failures"] = [{"id": f.item.id, "error": f.error} for f in result.failures[:20]]
    report["run"] = {**run, "model": result.model, "wall_s": result.wall_s}
    return report


def _number(value: Any, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(report: Mapping[str, Any]) -> str:
    """A short human summary of `report.json`."""
    run = report["run"]
    lines = [
        f"# Evaluation: {run['model']} on {Path(run['data']).name}",
        "",
        f"`{run['command']}`",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key in ("n", "errors", "accuracy", "ece", "brier", "log_loss", "latency_p50_ms", "latency_p95_ms"):
        lines.append(f"| {key} | {_number(report[key], 2 if key.startswith('latency') else 4)} |")
    lines.append(f"| abstentions | {report['abstentions']} ({_number(report['abstain_rate'])}) |")
    if report.get("order_checked"):
        for key in ("order_checked", "flip_rate", "flip_rate_reversed", "flip_rate_shuffled", "items_flipped"):
            lines.append(f"| {key} | {_number(report[key])} |")
        lines.append(f"| mean_probability_shift (total variation) | {report['mean_probability_shift']:.3g} |")
    lines += ["", "## Reliability (10 equal-width bins of top-label confidence)", ""]
    lines += ["| confidence | count | accuracy | mean confidence |", "|---|---|---|---|"]
    for b in report["ece_bins"]:
        lines.append(
            f"| {b['lower']:.1f}–{b['upper']:.1f} | {b['count']} | {_number(b['accuracy'], 3)} "
            f"| {_number(b['confidence'], 3)} |"
        )
    settings = ", ".join(f"{k}={_number(v, 2)}" for k, v in run.items() if k not in ("command", "model", "data"))
    lines += ["", f"Run: {settings}.", ""]
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], out: Path) -> None:
    """`report.json` and `report.md` into `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
