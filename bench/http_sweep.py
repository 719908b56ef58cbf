"""One HTTP sweep of a running server for one workload, written as a results JSON (the `canvasread bench` keys).

Usage: python3 bench/http_sweep.py URL MODEL OUT.json --workload standard|cold|think|span|steps4|mixed
           --quantization bf16|fp8-experts --server-command "..." [--levels 1,2,4] [--duration 5]
           [--baseline MODEL --baseline-levels 1,4] [--fresh]

With --fresh (a server started just before) no level is warmed up first, so
the sweep's first minute is what the first users of a new server see:
`first_minute_worst_ms` is the worst latency of the levels that began in it.
Every result records the engine's compiles and graph misses after the sweep
(`/metrics`), which must be zero past start-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import httpx

from canvasread.tools.bench import Level, run_sweep, summarise

TARGETS = {
    "bf16": {"single_client_p50_ms": 20, "decisions_per_s": 1000, "p95_ms_budget": 400},
    "fp8-experts": {"single_client_p50_ms": 15, "decisions_per_s": 1500, "p95_ms_budget": 400},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--workload", default="standard")
    parser.add_argument("--quantization", default="bf16", choices=sorted(TARGETS))
    parser.add_argument("--server-command", required=True)
    parser.add_argument("--levels", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--baseline")
    parser.add_argument("--baseline-levels", default="1,4")
    parser.add_argument("--gpu", default="unknown")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()

    def show(name: str) -> Callable[[Level], None]:
        def report(level: Level) -> None:
            print(name, args.workload, level.concurrency, "clients:", round(level.decisions_per_s, 1), "decisions/s",
                  "p50", level.p50_ms and round(level.p50_ms, 1), "p95", level.p95_ms and round(level.p95_ms, 1),
                  "errors", level.errors, flush=True)  # fmt: skip

        return report

    levels = [int(n) for n in args.levels.split(",")]
    sweep = run_sweep(args.url, args.model, levels, duration_s=args.duration, on_level=show(args.model),
                      workload=args.workload, warm=not args.fresh)  # fmt: skip
    baseline: list[Level] = []
    if args.baseline:
        baseline_levels = [int(n) for n in args.baseline_levels.split(",")]
        baseline = run_sweep(args.url, args.baseline, baseline_levels, duration_s=args.duration,
                             on_level=show(args.baseline), workload=args.workload)  # fmt: skip
    result = summarise(
        sweep,
        baseline,
        command='bash bench/gpu_bench.sh .cache/gpu/dgemma "$OUT"  # one H200 via the device tool',
        gpu=args.gpu,
        workload=args.workload,
        quantization=args.quantization,
        extra={
            "bench_command": " ".join(["python3", *sys.argv]),
            "server_command": args.server_command,
            "model": "DiffusionGemma-26B-A4B shape (config.json of the checkpoint), random N(0, 0.02) weights",
            "software": {"python": platform.python_version(), **{p: version(p) for p in ("torch", "transformers")}},
            "targets": TARGETS[args.quantization],
            "first_minute_worst_ms": first_minute_worst(sweep) if args.fresh else None,
            **engine_events(args.url),
        },
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def first_minute_worst(levels: list[Level]) -> float | None:
    """The worst latency of any level that began within the sweep's first 60 s."""
    worst, began = None, 0.0
    for level in levels:
        if began < 60.0 and level.max_ms is not None:
            worst = max(worst or 0.0, level.max_ms)
        began += level.elapsed_s
    return worst


def engine_events(url: str) -> dict[str, float]:
    """Compiles and graph misses the engine counted since start-up, summed over models and reasons."""
    text = httpx.get(url + "/metrics", headers={"Authorization": "Bearer local"}, timeout=10).text
    events = {"compiles_after_ready": 0.0, "graph_misses": 0.0}
    for line in text.splitlines():
        found = re.match(r"canvasread_engine_(compiles|graph_misses)_total\{.*\} ([0-9.e+-]+)$", line)
        if found:
            key = "compiles_after_ready" if found[1] == "compiles" else "graph_misses"
            events[key] += float(found[2])
    return events


if __name__ == "__main__":
    main()
