"""One HTTP sweep of a running server for one workload, written as a results JSON (the `canvasread bench` keys).

Usage: python3 bench/http_sweep.py URL MODEL OUT.json
           --workload standard|cold|think|span|steps4|mixed|mixed-samples1|think-beside
           --quantization bf16|fp8-experts --server-command "..." [--levels 1,2,4] [--duration 5]
           [--baseline MODEL --baseline-levels 1,4] [--fresh] [--thinkers 8]
           [--model-note "..."] [--command "..."]

`--model-note` and `--command` say what was served and the command that
reproduces the whole run; their defaults describe `bench/gpu_bench.sh`'s
(the full 26B-A4B shape with random weights), so a sweep of anything else
names its own.

With --fresh (a server started just before) no level is warmed up first, so
the sweep's first minute is what the first users of a new server see:
`first_minute_worst_ms` is the worst latency of the levels that began in it.
Every result records the engine's compiles and graph misses after the sweep
(`/metrics`), which must be zero past start-up, and the knee's goodput past
it (`goodput_past_knee`: decisions/s at 4x the knee's clients over the knee's).

`think-beside` (issue 24) is no workload of its own: for each level N it runs
N standard clients alone, then the same N beside --thinkers clients of the
think workload, and writes both p50s and p95s, their ratios and the thinkers'
own latency and requests/s (`canvasread.tools.beside.run_beside`).

Interrupted (Ctrl-C, or `timeout -s INT` at the end of a time budget), it
still writes the levels finished so far, marked `"interrupted": true`.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

from canvasread.tools.bench import Level, run_sweep, summarise
from canvasread.tools.beside import THINKERS, Beside, run_beside, summarise_beside

TARGETS = {
    "bf16": {"single_client_p50_ms": 20, "decisions_per_s": 1000, "p95_ms_budget": 400},
    "fp8-experts": {"single_client_p50_ms": 15, "decisions_per_s": 1500, "p95_ms_budget": 400},
}


BESIDE = "think-beside"
# What `bench/gpu_bench.sh` serves and runs: the defaults of --model-note and --command.
GPU_MODEL = "DiffusionGemma-26B-A4B shape (config.json of the checkpoint), random N(0, 0.02) weights"
GPU_COMMAND = 'PACK="$OUT/bench.tgz" bash bench/gpu_bench.sh .cache/gpu/dgemma /tmp/bench  # one H200, device tool'


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
    parser.add_argument("--thinkers", type=int, default=THINKERS, help=f"think clients beside ({BESIDE} only)")
    parser.add_argument("--model-note", default=GPU_MODEL, help="what the server serves, for the report")
    parser.add_argument("--command", default=GPU_COMMAND, help="the command that reproduces the whole run")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    extra = {
        "bench_command": " ".join(["python3", *sys.argv]),
        "server_command": args.server_command,
        "model": args.model_note,
        "software": {"python": platform.python_version(), **{p: version(p) for p in ("torch", "transformers")}},
        "targets": TARGETS[args.quantization],
        "clients": "closed loop over loopback HTTP; after a 529 a client waits its retry hint before its next request",
    }
    run = beside if args.workload == BESIDE else sweep
    result = run(args, levels, extra, args.command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def sweep(args: argparse.Namespace, levels: list[int], extra: dict[str, Any], command: str) -> dict[str, Any]:
    """The workload's sweep (and the baseline's), summarised as `canvasread bench` does."""
    done: dict[str, list[Level]] = {args.model: [], args.baseline or "": []}
    engine: list[dict[str, Any]] = []  # per level of the model: what the engine did meanwhile (warm-up included)
    last = [engine_work(args.url), time.monotonic()]

    def show(name: str) -> Callable[[Level], None]:
        def report(level: Level) -> None:
            done[name].append(level)
            now, work = time.monotonic(), engine_work(args.url)
            share = engine_share(last[0], work, now - last[1])
            last[:] = [work, now]
            if name == args.model:
                engine.append({"concurrency": level.concurrency, **share})
            print(name, args.workload, level.concurrency, "clients:", round(level.decisions_per_s, 1), "decisions/s",
                  "p50", level.p50_ms and round(level.p50_ms, 1), "p95", level.p95_ms and round(level.p95_ms, 1),
                  "shed", level.shed, "errors", level.errors, "engine", share, flush=True)  # fmt: skip

        return report

    interrupted = False
    try:
        run_sweep(args.url, args.model, levels, duration_s=args.duration, on_level=show(args.model),
                  workload=args.workload, warm=not args.fresh)  # fmt: skip
        if args.baseline:
            baseline_levels = [int(n) for n in args.baseline_levels.split(",")]
            run_sweep(args.url, args.baseline, baseline_levels, duration_s=args.duration,
                      on_level=show(args.baseline), workload=args.workload)  # fmt: skip
    except KeyboardInterrupt:
        interrupted = True
        print(args.workload, "interrupted: writing the levels finished so far", flush=True)
    measured = done[args.model]
    result = summarise(
        measured,
        done[args.baseline or ""] if args.baseline else [],
        command=command,
        gpu=args.gpu,
        workload=args.workload,
        quantization=args.quantization,
        extra={
            **extra,
            "first_minute_worst_ms": first_minute_worst(measured) if args.fresh else None,
            "interrupted": interrupted,
            "engine_per_level": engine,
            **engine_events(args.url),
        },
    )
    knee, ratio = result["knee_concurrency"], result["goodput_at_4x_knee_ratio"]
    print(args.model, args.workload, "knee", knee, "clients; decisions/s at 4x the knee / at the knee:",
          ratio and round(ratio, 3), flush=True)  # fmt: skip
    return result


def beside(args: argparse.Namespace, levels: list[int], extra: dict[str, Any], command: str) -> dict[str, Any]:
    """Standard clients alone and beside thinking clients, each level in turn."""
    done: list[Beside] = []

    def show(result: Beside) -> None:
        done.append(result)
        row = result.summary()
        print(args.model, BESIDE, row["concurrency"], "standard clients, p50/p95 alone",
              _ms(row["alone_p50_ms"]), _ms(row["alone_p95_ms"]), "beside", args.thinkers, "thinkers",
              _ms(row["beside_p50_ms"]), _ms(row["beside_p95_ms"]), "p95 ratio", row["p95_ratio"] and
              round(row["p95_ratio"], 3), "| think p50", _ms(row["think_p50_ms"]), "requests/s",
              round(row["think_requests_per_s"], 2), "| errors", result.alone.errors, result.beside.errors,
              result.think.errors, flush=True)  # fmt: skip

    interrupted = False
    try:
        run_beside(args.url, args.model, levels, duration_s=args.duration, thinkers=args.thinkers, on_level=show)
    except KeyboardInterrupt:
        interrupted = True
        print(BESIDE, "interrupted: writing the levels finished so far", flush=True)
    return summarise_beside(
        done,
        command=command,
        gpu=args.gpu,
        quantization=args.quantization,
        extra={**extra, "interrupted": interrupted, **engine_events(args.url)},
    )


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def first_minute_worst(levels: list[Level]) -> float | None:
    """The worst latency of any level that began within the sweep's first 60 s."""
    worst, began = None, 0.0
    for level in levels:
        if began < 60.0 and level.max_ms is not None:
            worst = max(worst or 0.0, level.max_ms)
        began += level.elapsed_s
    return worst


ENGINE_WORK = (
    "passes",
    "flat_passes",
    "pass_tokens",
    "pass_rows",
    "pass_seconds",
    "draw_seconds",
    "reads",
    "thoughts",
)


def engine_work(url: str) -> dict[str, float]:
    """The engine's work counters (passes, their tokens, rows and busy seconds), summed over models; empty when the
    server does not answer `/metrics`."""
    try:
        text = httpx.get(url + "/metrics", headers={"Authorization": "Bearer local"}, timeout=10).text
    except httpx.HTTPError:
        return {}
    work = dict.fromkeys(ENGINE_WORK, 0.0)
    for line in text.splitlines():
        found = re.match(r"canvasread_engine_([a-z_]+)_total\{.*\} ([0-9.e+-]+)$", line)
        if found and found[1] in work:
            work[found[1]] += float(found[2])
    return work


def engine_share(before: dict[str, float], after: dict[str, float], elapsed_s: float) -> dict[str, float | None]:
    """What the engine did during one level: passes a second, tokens and rows a pass, the share of the level's
    time it spent in passes and the draws after them (near 1: the engine is the bottleneck; well under it:
    something before it is), the draws' time a pass (a thought's GPU time shows there: its logits reach the host
    only in its draw), and the share of its passes that were flat (on a GPU: one graph replay each)."""
    if not before or not after:
        return {}
    delta = {key: after[key] - before[key] for key in ENGINE_WORK}
    passes = delta["passes"] or None
    busy_s = delta["pass_seconds"] + delta["draw_seconds"]
    return {
        "engine_passes_per_s": round(delta["passes"] / elapsed_s, 2) if elapsed_s else None,
        "engine_tokens_per_pass": round(delta["pass_tokens"] / passes, 1) if passes else None,
        "engine_rows_per_pass": round(delta["pass_rows"] / passes, 1) if passes else None,
        "engine_busy_share": round(busy_s / elapsed_s, 3) if elapsed_s else None,
        "engine_ms_per_pass": round(1000 * delta["pass_seconds"] / passes, 1) if passes else None,
        "engine_draw_ms_per_pass": round(1000 * delta["draw_seconds"] / passes, 1) if passes else None,
        "engine_flat_share": round(delta["flat_passes"] / passes, 3) if passes else None,
    }


def engine_events(url: str) -> dict[str, float | None]:
    """Compiles and graph misses the engine counted since start-up, summed over models and reasons (None: the
    server did not answer `/metrics`)."""
    try:
        text = httpx.get(url + "/metrics", headers={"Authorization": "Bearer local"}, timeout=10).text
    except httpx.HTTPError:
        return {"compiles_after_ready": None, "graph_misses": None}
    events = {"compiles_after_ready": 0.0, "graph_misses": 0.0}
    for line in text.splitlines():
        found = re.match(r"canvasread_engine_(compiles|graph_misses)_total\{.*\} ([0-9.e+-]+)$", line)
        if found:
            key = "compiles_after_ready" if found[1] == "compiles" else "graph_misses"
            events[key] += float(found[2])
    return dict(events)


if __name__ == "__main__":
    main()
