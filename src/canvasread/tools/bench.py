"""`canvasread bench`: drive a running server over HTTP at a sweep of concurrencies and report.

Each level runs closed-loop clients of one workload (`workloads.py`) for a
fixed time through `loadgen.drive`; decisions per second count the questions
of answered requests. A sweep's summary names its knee (the best decisions/s
within the p95 budget) and what is left of it at four times the knee's
clients (`goodput_past_knee`). The think-beside row is `beside.py`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import itertools
import json
import multiprocessing
import platform
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from canvasread.eval.metrics import quantile
from canvasread.tools.loadgen import LoadPlan, LoadReport, drive, merged
from canvasread.tools.workloads import WORKLOADS, answers_every_question

# Clients one load-driving process runs; a level of more is spread over several processes (`measure_spread`).
CLIENTS_PER_PROCESS = 32
# Request numbers a measured level may use (the n-th level numbers from n times this): states never repeat.
LEVEL_NUMBERS = 10_000_000
# The p95 a level may reach and still count as served (the knee: the targets' latency budget).
P95_BUDGET_MS = 400.0


@dataclass(frozen=True)
class Level:
    """One concurrency level of the sweep.

    `requests_ok` are the admitted requests (200), `shed` the 529s that carried a retry hint (a server refusing
    work it cannot take in time, as it should), `errors` everything else (other statuses, a 529 without its
    hint, no answer at all: `transport_errors` names those by httpx's error). Latencies are of admitted requests
    only: a 529 answers at once and would flatter them.
    """

    concurrency: int
    requests_ok: int
    shed: int
    errors: int
    statuses: dict[str, int]
    transport_errors: dict[str, int]
    decisions_per_s: float
    requests_per_s: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    elapsed_s: float

    @classmethod
    def from_report(cls, concurrency: int, report: LoadReport, decisions: int) -> Level:
        """`decisions`: the questions the level's answered requests held (workloads vary it per request)."""
        latencies = sorted(1000.0 * s for s in report.latencies_s.get(200, []))
        ok = report.statuses.get(200, 0)
        shed = report.statuses.get(529, 0) - report.shed_without_retry_hint
        elapsed = report.elapsed_s or 1e-9
        return cls(
            concurrency=concurrency,
            requests_ok=ok,
            shed=shed,
            errors=report.sent - ok - shed,
            statuses={str(k): v for k, v in sorted(report.statuses.items())},
            transport_errors=dict(sorted(report.transport_errors.items())),
            decisions_per_s=decisions / elapsed,
            requests_per_s=ok / elapsed,
            p50_ms=_quantile(latencies, 0.50),
            p95_ms=_quantile(latencies, 0.95),
            p99_ms=_quantile(latencies, 0.99),
            max_ms=latencies[-1] if latencies else None,
            elapsed_s=report.elapsed_s,
        )


def _quantile(values: Sequence[float], q: float) -> float | None:
    return quantile(values, q) if values else None


def run_sweep(
    url: str,
    model: str,
    concurrencies: Sequence[int],
    *,
    duration_s: float,
    api_key: str = "local",
    on_level: Callable[[Level], None] | None = None,
    workload: str = "standard",
    warm: bool = True,
) -> list[Level]:
    """Run every level in turn, each after a short warm-up at that concurrency unless `warm` is off.

    Clients are closed-loop; a client answered 529 waits its retry hint before its next request, as SDK clients do.
    """
    levels = []
    body = numbered(WORKLOADS[workload], model)  # never the same request twice in a sweep, warm-ups included
    for number, concurrency in enumerate(concurrencies, start=1):
        if warm:
            asyncio.run(drive(warmup_plan(url, concurrency, duration_s, api_key), body, answers_every_question))
        plan = level_plan(url, concurrency, duration_s, api_key)
        level = measure_spread(plan, workload, model, first=number * LEVEL_NUMBERS)
        levels.append(level)
        if on_level is not None:
            on_level(level)
    return levels


def numbered(
    make: Callable[[int, str], dict[str, Any]], model: str, numbers: Iterator[int] | None = None
) -> Callable[[int], dict[str, Any]]:
    """A body factory for `drive` that numbers requests from `numbers` (shared by factories that must never send
    the same state twice), not from the plan's own count."""
    numbers = numbers if numbers is not None else itertools.count()

    def body(_: int) -> dict[str, Any]:
        return make(next(numbers), model)

    return body


def level_plan(url: str, concurrency: int, duration_s: float, api_key: str) -> LoadPlan:
    """A measured level's clients: closed-loop, each waiting a 529's retry hint before its next request."""
    return LoadPlan(url, concurrency=concurrency, duration_s=duration_s, api_key=api_key, honour_retry_after=True)


def warmup_plan(url: str, concurrency: int, duration_s: float, api_key: str) -> LoadPlan:
    """A short run before a measured one: a fifth of its time (at least 0.5 s), two requests a client at most."""
    return LoadPlan(
        url,
        concurrency=concurrency,
        duration_s=max(0.5, duration_s / 5),
        max_requests=concurrency * 2,
        api_key=api_key,
        honour_retry_after=True,
    )


def measure_spread(plan: LoadPlan, workload: str, model: str, *, first: int) -> Level:
    """`measure`, its clients spread over processes of at most CLIENTS_PER_PROCESS each: one Python process
    driving hundreds of clients through httpx measures itself, not the server (measured here against a server
    answering at once: 86 requests/s from one process at 128 clients, where a C client got 380). Requests are
    numbered from `first`, each process taking every n-th number, so none repeats a state."""
    processes = -(-plan.concurrency // CLIENTS_PER_PROCESS)
    if processes == 1:
        return asyncio.run(measure(plan, numbered(WORKLOADS[workload], model, itertools.count(first))))
    shares = [plan.concurrency // processes + (k < plan.concurrency % processes) for k in range(processes)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        parts = list(pool.map(_measure_share, [replace(plan, concurrency=n) for n in shares],
                              [workload] * processes, [model] * processes,
                              [first + k for k in range(processes)], [processes] * processes))  # fmt: skip
    report = merged([part for part, _ in parts])
    return Level.from_report(plan.concurrency, report, sum(decisions for _, decisions in parts))


def _measure_share(plan: LoadPlan, workload: str, model: str, first: int, step: int) -> tuple[LoadReport, int]:
    """One process's share of a spread level: its report and the decisions its whole answers held."""
    answered: list[int] = []
    body = numbered(WORKLOADS[workload], model, itertools.count(first, step))
    report = asyncio.run(drive(plan, body, functools.partial(_counted, answered)))
    return report, sum(answered)


async def measure(plan: LoadPlan, body: Callable[[int], dict[str, Any]]) -> Level:
    """Drive one plan and make it a `Level`, counting the questions of every whole answer as decisions."""
    answered: list[int] = []
    report = await drive(plan, body, functools.partial(_counted, answered))
    return Level.from_report(plan.concurrency, report, sum(answered))


def _counted(answered: list[int], sent: dict[str, Any], answer: dict[str, Any]) -> bool:
    """`answers_every_question`, noting the questions of each whole answer in `answered`."""
    whole = answers_every_question(sent, answer)
    if whole:
        answered.append(len(sent["questions"]))
    return whole


def best_within_budget(levels: Sequence[Level], p95_budget_ms: float = P95_BUDGET_MS) -> Level | None:
    """The knee: the level with the most decisions per second whose p95 stays within the budget, every request
    answered (none shed, no errors)."""
    eligible = [
        lv for lv in levels if lv.p95_ms is not None and lv.p95_ms <= p95_budget_ms and lv.errors == 0 and lv.shed == 0
    ]
    return max(eligible, key=lambda lv: lv.decisions_per_s, default=None)


# How far past the knee goodput is measured: a server past its knee should keep serving at about its best rate
# (queueing or shedding the rest), not fall.
PAST_KNEE = 4


def goodput_past_knee(levels: Sequence[Level], p95_budget_ms: float = P95_BUDGET_MS) -> dict[str, Any]:
    """The knee and the level at `PAST_KNEE` times its clients, when that level was run: what was answered
    there (decisions/s of admitted requests, their p95, the shed and the errors) and its share of the knee's
    decisions/s, `goodput_at_4x_knee_ratio`. Every key is there, None where it cannot be said."""
    knee = best_within_budget(levels, p95_budget_ms)
    past = next((lv for lv in levels if knee and lv.concurrency == PAST_KNEE * knee.concurrency), None)
    return {
        "knee_concurrency": knee.concurrency if knee else None,
        "knee_decisions_per_s": knee.decisions_per_s if knee else None,
        "concurrency_at_4x_knee": PAST_KNEE * knee.concurrency if knee else None,
        "decisions_per_s_at_4x_knee": past.decisions_per_s if past else None,
        "p95_ms_at_4x_knee": past.p95_ms if past else None,
        "shed_at_4x_knee": past.shed if past else None,
        "errors_at_4x_knee": past.errors if past else None,
        "goodput_at_4x_knee_ratio": (
            past.decisions_per_s / knee.decisions_per_s if knee and past and knee.decisions_per_s else None
        ),
    }


def summarise(
    levels: Sequence[Level],
    baseline: Sequence[Level],
    *,
    command: str,
    gpu: str,
    extra: dict[str, Any] | None = None,
    workload: str = "standard",
    quantization: str = "bf16",
) -> dict[str, Any]:
    """The results file: the keys the benchmark issue asks for, then everything measured."""
    best = best_within_budget(levels)
    single = next((lv for lv in levels if lv.concurrency == 1), None)
    naive_best = best_within_budget(baseline) if baseline else None
    naive_single = next((lv for lv in baseline if lv.concurrency == 1), None)
    result: dict[str, Any] = {
        "gpu": gpu,
        "date": dt.date.today().isoformat(),
        "command": command,
        "single_client_p50_ms": single.p50_ms if single else None,
        "decisions_per_s": best.decisions_per_s if best else None,
        "p95_ms_at_best": best.p95_ms if best else None,
        "concurrency_at_best": best.concurrency if best else None,
        "naive_single_client_p50_ms": naive_single.p50_ms if naive_single else None,
        "naive_decisions_per_s": naive_best.decisions_per_s if naive_best else None,
        **goodput_past_knee(levels),
        "shed": sum(level.shed for level in levels),
        "sweep": [vars(level) for level in levels],
        "naive_sweep": [vars(level) for level in baseline],
        "workload": workload,
        "quantization": quantization,
        "request_example": WORKLOADS[workload](0, "jev-latest"),
        "host": {"python": platform.python_version(), "machine": platform.machine()},
    }
    if single and naive_single and single.p50_ms and naive_single.p50_ms:
        result["speedup_single_client_p50"] = naive_single.p50_ms / single.p50_ms
    if best and naive_best and naive_best.decisions_per_s:
        result["speedup_decisions_per_s"] = best.decisions_per_s / naive_best.decisions_per_s
    result.update(extra or {})
    return result


def write_outputs(result: dict[str, Any], out: Path) -> list[Path]:
    """`bench.json` and, when matplotlib is installed, `bench.png` (latency and throughput per concurrency)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench.json"]
    written[0].write_text(json.dumps(result, indent=2) + "\n")
    try:
        import matplotlib
    except ImportError:
        return written
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for name, sweep in (("canvasread", result["sweep"]), ("naive", result["naive_sweep"])):
        if not sweep:
            continue
        xs = [level["concurrency"] for level in sweep]
        throughput.plot(xs, [level["decisions_per_s"] for level in sweep], marker="o", label=name)
        latency.plot(xs, [level["p50_ms"] for level in sweep], marker="o", label=f"{name} p50")
        latency.plot(xs, [level["p95_ms"] for level in sweep], marker="x", linestyle="--", label=f"{name} p95")
    for axis, label in ((throughput, "decisions / s"), (latency, "latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend()
    latency.axhline(P95_BUDGET_MS, color="grey", linewidth=0.8)
    figure.suptitle(f"canvasread bench — {result['gpu']} — {result['date']}")
    figure.tight_layout()
    figure.savefig(out / "bench.png", dpi=120)
    plt.close(figure)
    written.append(out / "bench.png")
    return written
