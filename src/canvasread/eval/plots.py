"""The reliability diagram: accuracy against top-label confidence per bin, with bin counts.

matplotlib is an optional extra (`canvasread[plots]`); it is imported here
only, with the Agg backend, so eval runs headless and the base install stays
light.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOT_NEEDS = "the reliability diagram needs matplotlib: pip install 'canvasread[plots]'"


def can_plot() -> bool:
    """Known before a long run, so eval can say at the start that it will skip the PNG, not fail at the end."""
    return importlib.util.find_spec("matplotlib") is not None


def reliability_diagram(bins: Sequence[Mapping[str, Any]], title: str, path: Path) -> None:
    """Bars of per-bin accuracy over the diagonal of perfect calibration; each bar is labelled with its count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(5.5, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, constrained_layout=True
    )
    width = bins[0]["upper"] - bins[0]["lower"]
    centres = [(b["lower"] + b["upper"]) / 2 for b in bins]
    filled = [b for b in bins if b["count"]]
    top.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    top.bar(
        [(b["lower"] + b["upper"]) / 2 for b in filled],
        [b["accuracy"] for b in filled],
        width=width * 0.9,
        color="tab:blue",
        edgecolor="black",
        label="accuracy",
    )
    top.scatter(
        [b["confidence"] for b in filled],
        [b["accuracy"] for b in filled],
        color="tab:red",
        zorder=3,
        s=12,
        label="mean confidence",
    )
    for b in filled:
        top.annotate(
            str(b["count"]), ((b["lower"] + b["upper"]) / 2, b["accuracy"]), ha="center", va="bottom", fontsize=7
        )
    top.set_ylabel("accuracy")
    top.set_ylim(0, 1.05)
    top.set_title(title, fontsize=9)
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(centres, [b["count"] for b in bins], width=width * 0.9, color="tab:grey", edgecolor="black")
    bottom.set_xlabel("top-label confidence")
    bottom.set_ylabel("answers")
    bottom.set_xlim(0, 1)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def escalation_plot(report: Mapping[str, Any], path: Path) -> None:
    """Accuracy and ECE against the threshold, with the share escalated on its own axis (`eval --escalate`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["thresholds"]
    below = [row["below"] for row in rows]
    figure, left = plt.subplots(figsize=(6, 4), constrained_layout=True)
    left.plot(below, [row["accuracy"] for row in rows], marker="o", color="tab:blue", label="accuracy")
    left.plot(below, [row["ece"] for row in rows], marker="s", color="tab:red", label="ECE")
    left.set_xlabel("escalate below confidence")
    left.set_ylabel("accuracy, ECE")
    left.set_ylim(0, 1.05)
    right = left.twinx()
    shares = [row["share_escalated"] for row in rows]
    right.plot(below, shares, linestyle="--", color="grey", label="share escalated")
    right.set_ylabel("share escalated")
    right.set_ylim(0, 1.05)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles=handles, loc="lower right", fontsize=8)
    left.set_title(f"{report['model']} → {report['target']}: n={report['n']}", fontsize=9)
    figure.savefig(path, dpi=120)
    plt.close(figure)
