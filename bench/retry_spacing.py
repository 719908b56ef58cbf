"""Goodput past the knee with and without spaced retry hints, on a CPU, against a backend of known speed.

A 529's hint used to be the time the backlog needed to fall back within the latency budget (at least 50 ms):
every client shed at one moment came back at the next, to be shed again, and the server's one event loop spent
itself parsing and refusing them (on the H200, 430 529s a second at 4x the knee while the engine idled 39% of
the time). Now each shed request is told a time one mean job after the one before it (`Backlog.retry_after`).

This runs a real server (`create_app` under uvicorn, in a process of its own) over a paced backend: each batch
sleeps PASS_MS plus JOB_MS a request (MAX_BATCH at most), the interpreter lock released, as a GPU pass would.
Each variant gets a fresh server and the same sweep of closed-loop clients (spread over load processes, waiting
each 529's hint as the SDK's clients do); `unspaced` puts the old hint back in the server process.

    python bench/retry_spacing.py --out bench/results/retry-spacing-cpu.json

Prints one line a level and writes the sweep of both variants as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import uvicorn
from soak import wait_ready

from canvasread.admission import Backlog
from canvasread.backends.base import FunctionBackend, Gone, never_gone
from canvasread.batching import BatchSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.server.app import create_app
from canvasread.tools.bench import Level, goodput_past_knee, run_sweep
from canvasread.types import DecisionRequest, DecisionResult

PASS_MS = 20.0
JOB_MS = 5.0
BATCHES_AT_ONCE = 1
MAX_BATCH = 8  # 60 ms a full batch: about 130 requests/s, well under what the server's host side answers
QUEUE_DELAY_S = 0.35
PORT = 8931


class Paced(FunctionBackend):
    """Answers every question evenly after sleeping as long as a pass of its batch would take."""

    batches_at_once = BATCHES_AT_ONCE

    def __init__(self) -> None:
        super().__init__(lambda r: [[1 / len(q.options)] * len(q.options) for q in r.questions], name="paced")

    def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
        time.sleep((PASS_MS + JOB_MS * len(jobs)) / 1000.0)
        return super().decide(jobs, gone)


def unspaced(self: Backlog, over_s: float, now: float) -> float:
    """The hint before spacing: how far the backlog is past the budget, nothing more."""
    return max(0.0, over_s)


def serve(spaced: bool) -> None:
    if not spaced:
        Backlog.retry_after = unspaced  # type: ignore[method-assign]
    settings = DeciderSettings(batch=BatchSettings(max_batch=MAX_BATCH, max_queue_delay_s=QUEUE_DELAY_S))
    app = create_app(Decider([Paced()], settings))
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")


def sweep(spaced: bool, levels: list[int], duration_s: float) -> list[Level]:
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(spaced,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{PORT}"
    try:
        wait_ready(url, lambda: server.exitcode, timeout=60)
        name = "spaced" if spaced else "unspaced"
        return run_sweep(url, "paced", levels, duration_s=duration_s, on_level=lambda lv: print(name, line(lv)))
    finally:
        server.terminate()
        server.join(10)


def line(level: Level) -> str:
    shed_per_s = level.shed / level.elapsed_s if level.elapsed_s else 0.0
    return (
        f"{level.concurrency} clients: {level.decisions_per_s:.1f} decisions/s, p95 {level.p95_ms or 0:.0f} ms, "
        f"{shed_per_s:.0f} 529s/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="4,8,16,32,64,128,256")
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=Path("retry-spacing.json"))
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    report: dict[str, Any] = {
        "command": f"python bench/retry_spacing.py --levels {args.levels} --duration {args.duration:g}",
        "host": {
            "machine": platform.machine(),
            "cpus": multiprocessing.cpu_count(),
            "python": platform.python_version(),
        },
        "backend": {"pass_ms": PASS_MS, "job_ms": JOB_MS, "batches_at_once": BATCHES_AT_ONCE, "max_batch": MAX_BATCH},
        "max_queue_delay_s": QUEUE_DELAY_S,
    }
    for spaced in (False, True):
        result = sweep(spaced, levels, args.duration)
        report["spaced" if spaced else "unspaced"] = {
            "levels": [asdict(level) for level in result],
            **goodput_past_knee(result),
        }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name in ("unspaced", "spaced"):
        print(name, "goodput at 4x the knee:", report[name]["goodput_at_4x_knee_ratio"])


if __name__ == "__main__":
    main()
