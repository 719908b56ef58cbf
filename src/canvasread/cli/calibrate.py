"""`canvasread calibrate`: fit temperatures on labelled decisions and save them for `serve --calibration`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from canvasread.cli.errors import console
from canvasread.cli.options import DEFAULT_MODEL, Concurrency, Limit, ModelSpec, Order, command_line
from canvasread.eval.pipeline import DEFAULT_HOLDOUT, RunOptions

Data = Annotated[Path, typer.Argument(metavar="DATA", help="JSONL of labelled decisions to fit and test on.")]
Out = Annotated[Path, typer.Option(metavar="PATH", help="Where to write the calibration file.")]
Holdout = Annotated[float, typer.Option(metavar="SHARE", help="Share of decisions held out to measure before/after.")]
Seed = Annotated[int, typer.Option(metavar="N", help="Seed of the fit/held-out split.")]


METRICS = {"ece": "ECE", "log_loss": "log loss", "brier": "Brier"}


def _changes(held: dict[str, float]) -> list[str]:
    """Each metric as `before → after`, or — where the bucket held nothing out."""
    return [
        f"{held[f'{key}_before']:.4f} → {held[f'{key}_after']:.4f}" if f"{key}_before" in held else "—"
        for key in METRICS
    ]


def calibrate(
    data: Data,
    out: Out = Path("calibration.json"),
    model: ModelSpec = DEFAULT_MODEL,
    holdout: Holdout = DEFAULT_HOLDOUT,
    order: Order = RunOptions.order,
    concurrency: Concurrency = RunOptions.concurrency,
    limit: Limit = RunOptions.limit,
    seed: Seed = RunOptions.seed,
) -> None:
    """Fit temperature scaling per (question type, option-count bucket); report held-out ECE before and after."""
    from canvasread.eval.pipeline import calibrate as fit

    options = RunOptions(data, model, None, RunOptions.api_key, order, concurrency, limit, seed, command_line())
    result = fit(options, out, holdout=holdout)
    buckets = result.fit["buckets"]
    table = Table(title=f"{result.model}: held out, before → after")
    # The bucket and its temperature are what a user reads off and compares: never cut; the metrics wrap.
    table.add_column("bucket", no_wrap=True, min_width=max(map(len, ["bucket", *buckets])))
    for header in ("fit", "held out", "temperature"):
        table.add_column(header, no_wrap=True)
    for header in METRICS.values():
        table.add_column(header)
    held_out = result.fit["held_out"]
    for name, entry in buckets.items():
        temperature = "—" if entry["temperature"] is None else f"{entry['temperature']:.3f}"
        table.add_row(name, str(entry["n_fit"]), str(entry["n_held_out"]), temperature, *_changes(entry["held_out"]))
    table.add_row("all", "", str(held_out.get("n", 0)), "", *_changes(held_out))
    console.print(table)
    console.print(f"wrote {out} (fingerprint {result.fingerprint})", soft_wrap=True)
