"""A profiled read's GPU time, pass by pass: which kernels each pass of a Chrome trace spent its time in.

Usage: python3 bench/trace_passes.py TRACE.json.gz [--top 25] [--gap-us 300]

`gpu_pass_profile.py` saves a Chrome trace of each profiled read. A read of
several passes (a `steps: 4` read: its first pass, then a pass of its canvas
for each later step) shows on the GPU as runs of kernels with the host's
work between them. This splits the trace's kernels, copies and fills into
runs wherever the GPU idled longer than `--gap-us`, prints each run's
kernels, span and busy time, and for each run of more than 100 kernels (a
pass) its kernels by name, most time first.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
PASS_KERNELS = 100


def gpu_events(trace: Path) -> list[dict[str, Any]]:
    """The trace's GPU events (complete events of the GPU's categories), in start order."""
    with gzip.open(trace, "rt") as source:
        events = json.load(source)["traceEvents"]
    chosen = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    return sorted(chosen, key=lambda e: e["ts"])


def runs(events: list[dict[str, Any]], gap_us: float) -> list[list[dict[str, Any]]]:
    """The events split wherever the GPU idled more than `gap_us` between one's end and the next's start."""
    split: list[list[dict[str, Any]]] = []
    end = float("-inf")
    for event in events:
        if event["ts"] - end > gap_us:
            split.append([])
        split[-1].append(event)
        end = max(end, event["ts"] + event["dur"])
    return split


def by_name(run: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(kernel name cut to 80 characters, calls, ms) for one run, most time first."""
    totals: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in run:
        entry = totals[event["name"][:80]]
        entry[0] += 1
        entry[1] += event["dur"] / 1000.0
    return sorted(((name, int(c), ms) for name, (c, ms) in totals.items()), key=lambda row: -row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--gap-us", type=float, default=300.0)
    args = parser.parse_args()
    for number, run in enumerate(runs(gpu_events(args.trace), args.gap_us)):
        span = (max(e["ts"] + e["dur"] for e in run) - run[0]["ts"]) / 1000.0
        busy = sum(e["dur"] for e in run) / 1000.0
        print(f"run {number}: {len(run)} GPU events, span {span:.2f} ms, busy {busy:.2f} ms")
        if len(run) > PASS_KERNELS:
            for name, calls, ms in by_name(run)[: args.top]:
                print(f"  {ms:8.3f} ms {calls:5d}  {name}")


if __name__ == "__main__":
    main()
