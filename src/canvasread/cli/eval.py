"""`canvasread eval`: score a model on labelled decisions and write the report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from canvasread.cli.errors import console
from canvasread.cli.options import (
    DEFAULT_API_KEY,
    DEFAULT_MODEL,
    ApiKey,
    Concurrency,
    Limit,
    ModelSpec,
    Order,
    RemoteUrl,
    command_line,
)
from canvasread.eval.compare import DEFAULT_RESAMPLES, Configuration
from canvasread.eval.pipeline import RunOptions

HEADLINE = ("accuracy", "ece", "brier", "log_loss", "latency_p50_ms", "latency_p95_ms", "abstentions", "errors")
ORDER_CHECK = ("flip_rate", "mean_probability_shift")

Data = Annotated[
    Path, typer.Argument(metavar="DATA", help="JSONL of labelled decisions (`canvasread banking77` writes one).")
]
Out = Annotated[Path, typer.Option(metavar="DIR", help="Folder for report.json, report.md and reliability.png.")]
Calibration = Annotated[Path | None, typer.Option(metavar="PATH", help="In process: apply this calibration file.")]
OrderCheck = Annotated[
    bool, typer.Option(help="Re-ask choice questions with options reversed and shuffled; report flips.")
]
MinConfidence = Annotated[
    float | None, typer.Option(metavar="P", help="Set min_confidence on questions that lack it; count abstentions.")
]
Seed = Annotated[int, typer.Option(metavar="N", help="Seed of the order check's shuffles and of the bootstrap.")]
Compare = Annotated[
    list[str] | None,
    typer.Option(
        metavar="CONFIG",
        help="Give twice: compare two configurations, each MODEL, MODEL@LAYOUT (in process) or a server URL; "
        "reports B − A in accuracy, ECE and log loss with paired bootstrap intervals.",
    ),
]
Resamples = Annotated[int, typer.Option(metavar="N", help="With --compare: bootstrap resamples.")]
Escalate = Annotated[
    str | None,
    typer.Option(
        metavar="TARGET",
        help="Ask every decision of --model and of TARGET too (in process a model spec, with --url a served name); "
        "report accuracy, ECE and the share escalated at thresholds 0-1 (escalation.json, .md, .png).",
    ),
]


def print_report(report: dict[str, Any], written: tuple[Path, ...]) -> None:
    table = Table("metric", "value", title=f"{report['run']['model']}: {report['n']} decisions")
    for key in (*HEADLINE, *ORDER_CHECK):
        if report.get(key) is not None:
            table.add_row(key, f"{report[key]:.4g}" if isinstance(report[key], float) else str(report[key]))
    console.print(table)
    console.print(f"wrote {', '.join(str(path) for path in written)}")


def eval_command(
    data: Data,
    out: Out = Path("eval"),
    url: RemoteUrl = None,
    model: ModelSpec = DEFAULT_MODEL,
    api_key: ApiKey = DEFAULT_API_KEY,
    calibration: Calibration = None,
    order: Order = RunOptions.order,
    order_check: OrderCheck = False,
    min_confidence: MinConfidence = None,
    concurrency: Concurrency = RunOptions.concurrency,
    limit: Limit = RunOptions.limit,
    seed: Seed = RunOptions.seed,
    compare: Compare = None,
    resamples: Resamples = DEFAULT_RESAMPLES,
    escalate: Escalate = None,
) -> None:
    """Score a model on labelled decisions: accuracy, ECE, Brier, log loss, latency, order stability."""
    from canvasread.eval.pipeline import evaluate

    options = RunOptions(data, model, url, api_key, order, concurrency, limit, seed, command_line())
    if compare is not None:
        _compare(options, compare, out, resamples)
        return
    if escalate is not None:
        _escalation(options, escalate, out, calibration)
        return
    done = evaluate(options, out, order_check=order_check, min_confidence=min_confidence, calibration=calibration)
    print_report(done.report, done.written)


def _compare(options: RunOptions, configurations: list[str], out: Path, resamples: int) -> None:
    """`eval --compare A --compare B`: run both, print the paired differences, write compare.json and compare.md."""
    from canvasread.eval.pipeline import compare

    if len(configurations) != 2 or options.url is not None:
        raise ValueError("--compare takes exactly two configurations (give server URLs as configurations, not --url)")
    first, second = (Configuration.parse(text, options.model) for text in configurations)
    report = compare(options, (first, second), out, resamples=resamples)
    title = f"A = {first.label}, B = {second.label}"
    table = Table("metric", "A", "B", "B − A", "95% interval", "verdict", title=title)
    for name, entry in report["differences"].items():
        table.add_row(
            name,
            f"{report['a']['metrics'][name]:.4f}",
            f"{report['b']['metrics'][name]:.4f}",
            f"{entry['b_minus_a']:+.4f}",
            f"[{entry['ci_low']:+.4f}, {entry['ci_high']:+.4f}]",
            entry["verdict"],
        )
    console.print(table)
    console.print(f"{report['paired']} paired decisions; wrote {out / 'compare.json'} and {out / 'compare.md'}")


def _escalation(options: RunOptions, target: str, out: Path, calibration: Path | None) -> None:
    """`eval --escalate TARGET`: the threshold sweep as a table, and the files written."""
    from canvasread.eval.pipeline import escalation

    done = escalation(options, target, out, calibration=calibration)
    report = done.report
    table = Table("below", "escalated", "accuracy", "ECE", title=f"{report['model']} → {report['target']}")
    for row in report["thresholds"]:
        share = f"{row['share_escalated']:.1%}"
        table.add_row(f"{row['below']:.2f}", share, f"{row['accuracy']:.4f}", f"{row['ece']:.4f}")
    console.print(table)
    console.print(f"wrote {', '.join(str(path) for path in done.written)}")
