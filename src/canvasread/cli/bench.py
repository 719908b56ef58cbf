"""`canvasread bench`: sweep concurrency levels against a running server and save the curve."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from canvasread.cli.errors import UserError, console, warn
from canvasread.cli.options import DEFAULT_API_KEY, DEFAULT_URL, ApiKey, command_line

if TYPE_CHECKING:
    from canvasread.tools.bench import Level

PLOT_NEEDS = "the bench.png plot needs matplotlib: pip install 'canvasread[plots]'"
# The alias every server answers to; a sweep of `<model>-naive` needs its own name.
DEFAULT_BENCH_MODEL = "jev-latest"

Url = Annotated[str, typer.Option(metavar="URL", help="Server to drive (loopback only).")]
Model = Annotated[str, typer.Option(metavar="MODEL", help="Model name to ask.")]
Levels = Annotated[str, typer.Option(metavar="N,N,…", help="Comma-separated concurrency levels.")]
Duration = Annotated[float, typer.Option(metavar="SECONDS", help="Seconds per level (after a short warm-up).")]
Baseline = Annotated[
    str | None, typer.Option(metavar="MODEL", help="Also sweep this model (e.g. <model>-naive) as the baseline.")
]
Gpu = Annotated[str, typer.Option(metavar="TEXT", help="What the server runs on, for the report.")]
Out = Annotated[Path, typer.Option(metavar="DIR", help="Folder for bench.json and bench.png.")]


def levels_of(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"concurrency levels must be whole numbers separated by commas, not {text!r}") from None
    if not levels or min(levels) < 1:
        raise UserError(f"concurrency levels must be at least 1: {text!r}")
    return levels


def _preflight(url: str, model: str, api_key: str) -> None:
    """One request of the sweep's workload, sent as `ask --url` sends it: a server that cannot be reached, refuses
    the key or does not serve `model` ends the command in one line, not in a sweep of failures and a report of
    zeros."""
    from canvasread.cli.client import call
    from canvasread.tools.workloads import standard_body

    call("POST", url, "/v1/systemone", api_key, body=standard_body(-1, model))  # -1: a state no sweep sends


def _row(table: Table, name: str, level: Level) -> None:
    latencies = (level.p50_ms, level.p95_ms, level.p99_ms)
    table.add_row(
        name,
        str(level.concurrency),
        f"{level.decisions_per_s:.1f}",
        *(f"{v:.1f}" if v is not None else "-" for v in latencies),
        str(level.errors),
    )


def bench(
    url: Url = DEFAULT_URL,
    model: Model = DEFAULT_BENCH_MODEL,
    concurrency: Levels = "1,2,4,8,16,32,64,128,256",
    duration: Duration = 10.0,
    baseline_model: Baseline = None,
    baseline_concurrency: Levels = "1,4,16",
    gpu: Gpu = "unknown",
    api_key: ApiKey = DEFAULT_API_KEY,
    out: Out = Path("bench-out"),
) -> None:
    """Sweep concurrency levels against a running server; print and save decisions/s and latency percentiles."""
    from canvasread.eval.plots import can_plot
    from canvasread.tools.bench import run_sweep, summarise, write_outputs

    plan = [(model, levels_of(concurrency))]
    if baseline_model:
        plan.append((baseline_model, levels_of(baseline_concurrency)))
    for name, _ in plan:
        _preflight(url, name, api_key)
    if not can_plot():
        warn(f"{PLOT_NEEDS}; writing bench.json only")
    table = Table("model", "clients", "decisions/s", "p50 ms", "p95 ms", "p99 ms", "errors")
    sweeps: dict[str, list[Level]] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("sweeping", total=sum(len(levels) for _, levels in plan))

        def show(name: str) -> Callable[[Level], None]:
            def record(level: Level) -> None:
                progress.advance(task)
                _row(table, name, level)

            return record

        for name, levels in plan:
            sweeps[name] = run_sweep(url, name, levels, duration_s=duration, api_key=api_key, on_level=show(name))
    console.print(table)
    result = summarise(sweeps[model], sweeps.get(baseline_model or "", []), command=command_line(), gpu=gpu)
    for path in write_outputs(result, out):
        console.print(f"wrote {path}")
