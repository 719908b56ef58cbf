"""Paired comparison of two configurations on the same labelled decisions, with bootstrap confidence intervals.

Both configurations answer the same items, so the differences are paired:
each bootstrap resample draws items (with replacement) and recomputes every
metric of both configurations on that one resample, so the interval of a
difference reflects the items both got right or wrong together rather than
two independent spreads. A difference whose 95% interval excludes 0 is one
the data supports.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from canvasread.eval.metrics import Probabilities, accuracy, ece, log_loss

# Resamples: enough for stable 95% percentile bounds (their Monte Carlo error is well under the interval's width).
DEFAULT_RESAMPLES = 1000
CONFIDENCE = 0.95
METRICS: dict[str, Callable[[Sequence[Probabilities], Sequence[int]], float]] = {
    "accuracy": accuracy,
    "ece": ece,
    "log_loss": log_loss,
}
# Which way is better, for the report's wording: higher accuracy, lower ECE and log loss.
HIGHER_IS_BETTER = {"accuracy": True, "ece": False, "log_loss": False}


@dataclass(frozen=True)
class Configuration:
    """One side of a comparison: a running server (`url`), or a model in process with a read layout."""

    label: str
    model: str
    url: str | None = None
    layout: str | None = None

    @classmethod
    def parse(cls, text: str, model: str = "default") -> Configuration:
        """`http(s)://…` (a server, asked for `model`), or `MODEL[@LAYOUT]` in process (`default`: embedded)."""
        if not text:
            raise ValueError("--compare needs a configuration: MODEL, MODEL@LAYOUT or a server URL")
        if text.startswith(("http://", "https://")):
            return cls(text, model, url=text)
        name, at, layout = text.rpartition("@")
        if not at:
            return cls(text, text)
        if not name or not layout:
            raise ValueError(f"--compare {text!r}: write MODEL@LAYOUT, e.g. /models/dgemma@thought-on-canvas")
        return cls(text, name, layout=layout)


@dataclass(frozen=True)
class Difference:
    """Metric of B minus metric of A, with its bootstrap percentile interval."""

    estimate: float
    low: float
    high: float

    def as_json(self) -> dict[str, float]:
        return {"b_minus_a": self.estimate, "ci_low": self.low, "ci_high": self.high}


def paired_differences(
    first: Sequence[Probabilities],
    second: Sequence[Probabilities],
    expected: Sequence[int],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, Difference]:
    """B − A for every metric, on the same items, with `CONFIDENCE` percentile intervals from a paired bootstrap."""
    if not len(first) == len(second) == len(expected) or not expected:
        raise ValueError("a paired comparison needs the same, non-empty set of answered items on both sides")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(expected), size=(resamples, len(expected)))
    result = {}
    tail = (1.0 - CONFIDENCE) / 2.0
    for name, metric in METRICS.items():
        estimate = metric(second, expected) - metric(first, expected)
        spread = [
            metric([second[i] for i in draw], [expected[i] for i in draw])
            - metric([first[i] for i in draw], [expected[i] for i in draw])
            for draw in draws
        ]
        low, high = np.quantile(spread, [tail, 1.0 - tail])
        result[name] = Difference(float(estimate), float(low), float(high))
    return result


def verdict(name: str, difference: Difference) -> str:
    """Which side the interval favours, or that it does not exclude 0."""
    if difference.low <= 0.0 <= difference.high:
        return "no clear difference"
    b_better = (difference.estimate > 0) == HIGHER_IS_BETTER[name]
    return "B better" if b_better else "A better"


def write_comparison(report: dict[str, Any], out: Path) -> None:
    """compare.json (everything) and compare.md (the table people read)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    a, b = report["a"], report["b"]
    lines = [
        f"# {a['label']} (A) vs {b['label']} (B)",
        "",
        f"{report['paired']} decisions answered by both (of {report['decisions']}); "
        f"{int(CONFIDENCE * 100)}% paired bootstrap intervals over {report['resamples']} resamples.",
        "",
        "| metric | A | B | B − A | interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in report["differences"].items():
        lines.append(
            f"| {name} | {a['metrics'][name]:.4f} | {b['metrics'][name]:.4f} | {entry['b_minus_a']:+.4f} "
            f"| [{entry['ci_low']:+.4f}, {entry['ci_high']:+.4f}] | {entry['verdict']} |"
        )
    (out / "compare.md").write_text("\n".join(lines) + "\n")
