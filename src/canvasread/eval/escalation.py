"""`eval --escalate`: what escalation would buy at each threshold, from two runs over the same decisions.

Each decision is its own request, and escalation re-asks an unsure question of the target alone with the
same state, so the answer served at threshold P is the first model's where its confidence (the kind's, as
`min_confidence` compares) is at least P, else the target's. One run of each model therefore gives every
threshold at once: accuracy, ECE and log loss of the mixed answers, and the share escalated (what the
target's cost scales with). Decisions either run failed are left out of both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from canvasread.eval.report import scores
from canvasread.eval.runner import Outcome
from canvasread.kinds import kind_of
from canvasread.types import Distribution, Option, Question

# 0 (never escalate) to 1 (escalate every answer that is not certain), in steps of 0.05.
THRESHOLDS = tuple(round(step / 20, 2) for step in range(21))


def confidence(outcome: Outcome) -> float:
    """The first model's confidence in its answer, as escalation judges it."""
    item = outcome.item
    question = Question("decision", item.kind, None, tuple(Option(name) for name in item.options))
    return kind_of(item.kind).confidence(question, Distribution(outcome.probabilities))


def sweep(
    first: Sequence[Outcome],
    second: Sequence[Outcome],
    model: str,
    target: str,
    thresholds: Sequence[float] = THRESHOLDS,
) -> dict[str, Any]:
    """Accuracy, ECE, log loss and the share escalated at each threshold (see the module docstring)."""
    again = {outcome.item.id: outcome for outcome in second}
    pairs = [(outcome, again[outcome.item.id]) for outcome in first if outcome.item.id in again]
    if not pairs:
        raise ValueError("no decision was answered by both models")
    sure = [confidence(outcome) for outcome, _ in pairs]
    rows = []
    for threshold in thresholds:
        mixed = [target_answer if c < threshold else own for (own, target_answer), c in zip(pairs, sure, strict=True)]
        measured = scores(mixed)
        escalated = sum(1 for c in sure if c < threshold)
        rows.append(
            {
                "below": threshold,
                "escalated": escalated,
                "share_escalated": escalated / len(pairs),
                **{key: measured[key] for key in ("accuracy", "ece", "log_loss", "brier")},
            }
        )
    return {
        "model": model,
        "target": target,
        "n": len(pairs),
        "alone": {key: rows[0][key] for key in ("accuracy", "ece", "log_loss")},
        "target_alone": {key: scores([t for _, t in pairs])[key] for key in ("accuracy", "ece", "log_loss")},
        "thresholds": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Escalation: {report['model']} → {report['target']} ({report['n']} decisions)",
        "",
        "| below | escalated | share | accuracy | ECE | log loss |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["thresholds"]:
        cells = (row["share_escalated"], row["accuracy"], row["ece"], row["log_loss"])
        lines.append(f"| {row['below']:.2f} | {row['escalated']} | " + " | ".join(f"{v:.4f}" for v in cells) + " |")
    target = report["target_alone"]
    lines += ["", f"{report['target']} alone: accuracy {target['accuracy']:.4f}, ECE {target['ece']:.4f}."]
    return "\n".join(lines) + "\n"


def write_escalation(report: dict[str, Any], out: Path) -> tuple[Path, ...]:
    """escalation.json and escalation.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "escalation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "escalation.md").write_text(markdown(report))
    return out / "escalation.json", out / "escalation.md"
