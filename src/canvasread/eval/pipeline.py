"""What `canvasread eval` (and `eval --compare`) and `canvasread calibrate` do, without the flags.

The CLI only turns flags into the option objects below, so the same runs can
be scripted from Python.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from canvasread.backends.base import HasFingerprint
from canvasread.calibration import Calibration
from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.layouts import layout_named
from canvasread.catalog import open_decider
from canvasread.decide import DEFAULT_ALIASES, Decider
from canvasread.errors import CalibrationMismatch
from canvasread.eval.calibrate import fit_calibration
from canvasread.eval.compare import (
    DEFAULT_RESAMPLES,
    METRICS,
    Configuration,
    paired_differences,
    verdict,
    write_comparison,
)
from canvasread.eval.dataset import EvalItem, load_items
from canvasread.eval.escalation import sweep, write_escalation
from canvasread.eval.plots import PLOT_NEEDS, can_plot, escalation_plot, reliability_diagram
from canvasread.eval.report import build_report, write_report
from canvasread.eval.runner import RunResult, http_asker, local_asker, run_items
from canvasread.types import OrderMode

# Share of decisions `calibrate` holds out: enough to measure ECE before/after on a few hundred decisions.
DEFAULT_HOLDOUT = 0.3


@dataclass(frozen=True)
class RunOptions:
    """Which decisions to ask, of what, and how; shared by eval and calibrate."""

    data: Path
    model: str = "default"
    url: str | None = None
    api_key: str = "local"
    order: OrderMode | None = None
    concurrency: int = 8
    limit: int | None = None
    seed: int = 0
    command: str = ""


def file_sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _local_decider(model: str, calibration: Path | None = None, layout: str | None = None) -> Decider:
    """The model in process (`default` is the embedded one) read with `layout`, a calibration applied if given."""
    reading = ReadSettings()
    if layout is not None:
        if model in DEFAULT_ALIASES or model.startswith("sparrow-"):
            raise ValueError(f"{model!r} reads no canvas, so it has no read layout; give a DiffusionGemma checkpoint")
        reading = ReadSettings(layout=layout_named(layout))
    decider = open_decider((model,), reading=reading)
    if calibration is not None:
        decider.use_calibration(Calibration.load(calibration))
    return decider


async def _ask_all(
    items: list[EvalItem],
    options: RunOptions,
    decider: Decider | None,
    order_check: bool,
    console: Console,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Every item asked of `options.model` (in process: of the decider's default unless `options.model` is
    served there by name)."""
    settings: dict[str, Any] = {
        "order": options.order,
        "order_check": order_check,
        "concurrency": options.concurrency,
        "seed": options.seed,
        "console": console,
        "extra": extra,
    }
    if decider is None:
        assert options.url is not None
        async with http_asker(options.url, options.api_key) as asker:
            return await run_items(items, asker, model=options.model, **settings)
    model = options.model if options.model in {served.card.name for served in decider.served} else "default"
    async with local_asker(decider) as asker:
        return await run_items(items, asker, model=model, **settings)


def _run_record(options: RunOptions, items: list[EvalItem]) -> dict[str, Any]:
    return {
        "command": options.command,
        "data": str(options.data),
        "data_sha256": file_sha256(options.data),
        "decisions": len(items),
        "source": options.url or "in-process",
        "order": options.order or "as-given",
        "concurrency": options.concurrency,
        "seed": options.seed,
    }


@dataclass(frozen=True)
class Evaluation:
    """The report and the files written (reliability.png only when matplotlib is installed)."""

    report: dict[str, Any]
    written: tuple[Path, ...]


def evaluate(
    options: RunOptions,
    out: Path,
    *,
    order_check: bool = False,
    min_confidence: float | None = None,
    calibration: Path | None = None,
    console: Console | None = None,
) -> Evaluation:
    """Ask every decision, then write report.json, report.md and (with matplotlib) reliability.png to `out`."""
    console = console or Console(stderr=True)
    plot = can_plot()
    if not plot:
        console.print(f"[yellow]warning:[/yellow] {escape(PLOT_NEEDS)}; writing report.json and report.md only")
    if options.url is not None and calibration is not None:
        raise ValueError("--calibration applies in process; for a server, start it with `serve --calibration`")
    items = load_items(options.data, options.limit)
    if min_confidence is not None:
        items = [replace(i, question={"min_confidence": min_confidence, **i.question}) for i in items]
    decider = None if options.url is not None else _local_decider(options.model, calibration)
    result = asyncio.run(_ask_all(items, options, decider, order_check, console))
    run = {
        **_run_record(options, items),
        "min_confidence": min_confidence,
        "calibration": str(calibration) if calibration else None,
    }
    report = build_report(result, run, order_check)
    write_report(report, out)
    written: tuple[Path, ...] = (out / "report.json", out / "report.md")
    if plot:
        title = f"{report['run']['model']} on {options.data.name}: n={report['n']}, ECE={report['ece']:.4f}"
        reliability_diagram(report["ece_bins"], title, out / "reliability.png")
        written += (out / "reliability.png",)
    return Evaluation(report, written)


def calibrate(
    options: RunOptions, out: Path, *, holdout: float = DEFAULT_HOLDOUT, console: Console | None = None
) -> Calibration:
    """Read the labelled decisions in process, fit temperatures on a hash split, save the file to `out`."""
    if options.url is not None:
        raise ValueError("calibrate runs the model in process (it must hash the weights); use --model, not --url")
    if not 0.0 < holdout < 1.0:
        raise ValueError("holdout must be between 0 and 1 (exclusive)")
    console = console or Console(stderr=True)
    items = load_items(options.data, options.limit)
    decider = _local_decider(options.model)
    served = decider.resolve("default")
    fingerprint = served.backend.fingerprint if isinstance(served.backend, HasFingerprint) else None
    if fingerprint is None:
        raise CalibrationMismatch(f"{served.card.name} has no fingerprint, so a calibration could not be checked later")
    result = asyncio.run(_ask_all(items, options, decider, False, console))
    run = {**_run_record(options, items), "answered": len(result.outcomes), "errors": len(result.failures)}
    calibration = fit_calibration(
        result.outcomes, served.card.name, fingerprint, holdout=holdout, seed=options.seed, run=run
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    calibration.save(out)
    return calibration


def compare(
    options: RunOptions,
    configurations: tuple[Configuration, Configuration],
    out: Path,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    console: Console | None = None,
) -> dict[str, Any]:
    """Ask every decision of both configurations, then write compare.json and compare.md; returns the report.

    Differences are B − A on the decisions both answered, with paired bootstrap intervals (`eval.compare`).
    """
    console = console or Console(stderr=True)
    items = load_items(options.data, options.limit)
    sides = []
    for configuration in configurations:
        side = replace(options, model=configuration.model, url=configuration.url)
        decider = None if configuration.url else _local_decider(configuration.model, layout=configuration.layout)
        result = asyncio.run(_ask_all(items, side, decider, False, console))
        sides.append({o.item.id: o for o in result.outcomes})
    paired = [item for item in items if all(item.id in side for side in sides)]
    if not paired:
        raise ValueError("no decision was answered by both configurations")
    answers = [[side[item.id].probabilities for item in paired] for side in sides]
    expected = [item.expected_index for item in paired]
    differences = paired_differences(answers[0], answers[1], expected, resamples=resamples, seed=options.seed)
    report: dict[str, Any] = {
        "run": _run_record(options, items),
        "decisions": len(items),
        "paired": len(paired),
        "resamples": resamples,
        **{
            key: {
                "label": configuration.label,
                "answered": len(side),
                "metrics": {name: metric(distributions, expected) for name, metric in METRICS.items()},
            }
            for key, configuration, side, distributions in zip("ab", configurations, sides, answers, strict=True)
        },
        "differences": {
            name: {**difference.as_json(), "verdict": verdict(name, difference)}
            for name, difference in differences.items()
        },
    }
    write_comparison(report, out)
    return report


def escalation(
    options: RunOptions, target: str, out: Path, *, calibration: Path | None = None, console: Console | None = None
) -> Evaluation:
    """`eval --escalate TARGET`: every decision asked of the model (escalation off) and of the target, then
    accuracy, ECE and the share escalated at each threshold (`eval.escalation`), to `out`."""
    console = console or Console(stderr=True)
    if options.url is not None and calibration is not None:
        raise ValueError("--calibration applies in process; for a server, start it with `serve --calibration`")
    items = load_items(options.data, options.limit)
    first_decider = second_decider = None
    if options.url is None:  # one decider each: a decider's batch loops run once
        first_decider, second_decider = _local_decider(options.model), _local_decider(target)
        if calibration is not None:
            loaded = Calibration.load(calibration)
            served = {served.card.name for served in second_decider.served}
            (second_decider if loaded.model in served else first_decider).use_calibration(loaded)
    first = asyncio.run(_ask_all(items, options, first_decider, False, console, {"escalate": {"below": 0}}))
    second = asyncio.run(_ask_all(items, replace(options, model=target), second_decider, False, console))
    report = sweep(first.outcomes, second.outcomes, first.model or options.model, second.model or target)
    report["run"] = {**_run_record(options, items), "escalate": target, "calibration": str(calibration or "") or None}
    written = write_escalation(report, out)
    if can_plot():
        escalation_plot(report, out / "escalation.png")
        written += (out / "escalation.png",)
    return Evaluation(report, written)
