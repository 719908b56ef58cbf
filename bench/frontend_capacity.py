"""What the HTTP front end alone can take: the real server over a canvas backend whose reader answers at once.

Usage: python3 bench/frontend_capacity.py OUT.json [--levels 1,8,32] [--duration 10] [--workload standard]
           [--tokenizer FOLDER]

Issue 23 asks HTTP to reach 90% of the reader's throughput, so the server's
own cost a request (parsing, checks, middlewares, the decider's stages,
planning and tokenising, readout, the response) bounds every row of
`gpu_bench.sh`. Here the reader (`Instant`) gives every label the same
log-probability without any model, so all that is left is that cost: each
level reports requests and decisions per second, the latencies, and the CPU
time the server process spent a request (`/proc`, so Linux only). The
tokenizer is a checkpoint folder's (default: a fresh tiny checkpoint, whose
tokenizer has the real 262k vocabulary). The load generator runs on the same
machine, so on a small one both share its cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from soak import wait_ready

from canvasread.canvas.backend import CanvasBackend, CanvasRuntime
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.tokenizer import HFTokenizer, pretrained
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.server.run import uvicorn_config
from canvasread.settings import ServerSettings
from canvasread.tools.bench import run_sweep
from canvasread.tools.checkpoints import fetch_gemma_tokenizer
from canvasread.types import ModelCard

PORT = 8079
# The canvas a real DiffusionGemma checkpoint reads (its config's canvas_length).
CANVAS_LENGTH = 256
WARM_S = 2.0


class Instant:
    """A reader that answers every read at once: each label of a slot equally likely, no model."""

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        return [[SlotLogProbs((-math.log(len(s.label_ids)),) * len(s.label_ids)) for s in r.slots] for r in reads]


def serve(tokenizer_folder: str, port: int) -> None:
    """The server `canvasread serve` builds, over a canvas backend reading through `Instant`."""
    tokenizer = HFTokenizer(pretrained(tokenizer_folder))
    card = ModelCard("instant", "a canvas backend over a reader that answers at once", "2026-12-04")
    runtime = CanvasRuntime(Instant(), tokenizer, CANVAS_LENGTH, None, "sha256:instant")
    decider = Decider([CanvasBackend(card, lambda: runtime)])
    decider.load()
    settings = ServerSettings(port=port)
    uvicorn.Server(uvicorn_config(create_app(decider, settings), settings, log_level="warning")).run()


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, pid: int, levels: list[int], duration_s: float, workload: str) -> list[dict[str, Any]]:
    results = []
    for concurrency in levels:
        run_sweep(url, "instant", [concurrency], duration_s=WARM_S, workload=workload, warm=False)
        before = cpu_s(pid)
        [level] = run_sweep(url, "instant", [concurrency], duration_s=duration_s, workload=workload, warm=False)
        spent = cpu_s(pid) - before
        row = {**vars(level), "server_cpu_ms_per_request": 1000 * spent / max(level.requests_ok, 1)}
        shown = ("concurrency", "requests_per_s", "decisions_per_s", "p50_ms", "p95_ms", "server_cpu_ms_per_request")
        print(json.dumps({key: row[key] for key in shown}), flush=True)
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--workload", default="standard")
    parser.add_argument("--tokenizer")
    parser.add_argument("--serve", nargs=2, metavar=("FOLDER", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.tokenizer or str(fetch_gemma_tokenizer(Path(scratch) / "tokenizer"))
        server = subprocess.Popen([sys.executable, __file__, str(args.out), "--serve", folder, str(PORT)])
        url = f"http://127.0.0.1:{PORT}"
        try:
            wait_ready(url, server.poll)
            levels = measure(url, server.pid, [int(n) for n in args.levels.split(",")], args.duration, args.workload)
        finally:
            server.terminate()
            server.wait(timeout=30)
    report = {
        "what": "the HTTP front end alone: a canvas backend whose reader answers at once",
        "command": " ".join(["python3", *sys.argv]),
        "date": time.strftime("%Y-%m-%d"),
        "workload": args.workload,
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "levels": levels,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
