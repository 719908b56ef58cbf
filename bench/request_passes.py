"""How many engine passes a lone request waits through, by workload (the in-process engine on a checkpoint, CPU).

Usage: python3 bench/request_passes.py CHECKPOINT OUT.json [--workloads standard,mixed,span,steps4] [--requests 20]

At one client a request's latency is the passes it waits through one after
another: on a GPU each costs at least the pass floor (every expert's weights
streamed, about 23 ms on the H200), whatever it holds. This opens CHECKPOINT
(the tiny one: `canvasread tiny-checkpoint`) as `canvasread serve` does,
decides the workloads' request bodies one at a time with their default
options (bodies it has not seen: sequence numbers from 10,000), and counts
the engine's passes and the reads, re-reads and reads ahead behind each
request, from the backend's own counters. The counts depend on the code, not
on the machine's speed (a random tiny model is as unsure as the full-size
random one, so "auto" requests re-read as they do on the H200): run it on two
versions of the code (`PYTHONPATH=OLD/src`) to compare them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import canvasread
from canvasread.canvas.backend import CanvasBackend
from canvasread.catalog import open_decider
from canvasread.tools.workloads import WORKLOADS
from canvasread.wire import parse_request

COUNTED = ("passes", "reads", "rereads", "reads_ahead", "reads_ahead_unused")
FIRST_SEQUENCE = 10_000


def per_request(backend: CanvasBackend, workload: str, requests: int) -> dict[str, Any]:
    """Each counter's mean and largest rise per request, and the mean wall time, for `requests` lone requests."""
    rises: dict[str, list[float]] = {name: [] for name in COUNTED}
    seconds = []
    for sequence in range(FIRST_SEQUENCE, FIRST_SEQUENCE + requests):
        job = backend.prepare(parse_request(WORKLOADS[workload](sequence, "m"))[1])
        before, started = backend.counters(), time.monotonic()
        backend.decide([job])
        seconds.append(time.monotonic() - started)
        after = backend.counters()
        for name in COUNTED:
            rises[name].append(after.get(name, 0.0) - before.get(name, 0.0))
    counted = {name: {"mean": statistics.fmean(values), "max": max(values)} for name, values in rises.items()}
    return {"requests": requests, **counted, "wall_s_mean": statistics.fmean(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("out", type=Path)
    parser.add_argument("--workloads", default="standard,mixed,span,steps4")
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    decider = open_decider((args.checkpoint,))
    backend = decider.served[0].backend
    if not isinstance(backend, CanvasBackend):
        parser.error(f"{args.checkpoint} is not served by the canvas engine")
    report = {
        "checkpoint": args.checkpoint,
        "code": str(Path(canvasread.__file__).parent),  # which version ran, with PYTHONPATH=OLD/src
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "workloads": {name: per_request(backend, name, args.requests) for name in args.workloads.split(",")},
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for name, counted in report["workloads"].items():
        print(name, {key: value["mean"] if isinstance(value, dict) else value for key, value in counted.items()})


if __name__ == "__main__":
    main()
