"""The real server and engine on a CPU, each engine pass padded to the time a modeled GPU pass takes.

Usage: python3 bench/paced_engine.py CHECKPOINT OUT.json [--levels 8,32,64] [--duration 20]
           [--floor-ms 116] [--token-ms 0.1225] [--workload standard] [--fresh] [-- SERVE FLAGS...]

How passes form under closed-loop clients (how many requests share a pass,
how many passes a request waits through) depends on the pass's cost shape:
on a GPU a pass costs a floor (every expert's weights read) plus its tokens;
on a CPU it costs about its tokens. This serves CHECKPOINT (the tiny one:
`canvasread tiny-checkpoint`) with the engine in the server's process and
every pass padded with a sleep to `floor + token × tokens`. The default line
is the H200's own (23.2 ms + 0.0245 ms a token, fitted to
`h200-2026-12-04d/call7`'s `engine_per_level`), slowed 5× so the tiny
model's real CPU pass always fits under it; the front end is then 5× cheaper
against a pass than on the GPU machine. The report keeps each level's
measured `engine_ms_per_pass` beside the line's value for its tokens, so a
level whose real passes overran the line shows it.

It measures the scheduling (batch queue, admission, engine loop) under that
cost shape, not a GPU: run the same command against two versions of the code
(`PYTHONPATH=OLD/src`) to compare them.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from soak import wait_ready

PORT = 8077
# The H200's pass line (bench/results/cpu-2026-12-05/README.md), 5x slower.
FLOOR_MS = 5 * 23.2
TOKEN_MS = 5 * 0.0245


def paced(run: Callable[..., Any], floor_ms: float, token_ms: float) -> Callable[..., Any]:
    """`FusedRunner.run`, then a sleep up to the line's time for the pass's tokens."""

    @functools.wraps(run)
    def pass_at_line_speed(self: Any, rows: Sequence[Any], store: Any) -> Any:
        started = time.monotonic()
        outputs = run(self, rows, store)
        line_s = (floor_ms + token_ms * sum(len(row.ids) for row in rows)) / 1000
        time.sleep(max(0.0, line_s - (time.monotonic() - started)))
        return outputs

    return pass_at_line_speed


def serve(checkpoint: str, port: int, floor_ms: float, token_ms: float, flags: list[str]) -> None:
    """`canvasread serve` with the engine in this process and its passes paced."""
    from canvasread.canvas.engine.runner import FusedRunner
    from canvasread.cli import app

    FusedRunner.run = paced(FusedRunner.run, floor_ms, token_ms)  # type: ignore[method-assign]
    args = ["serve", "--model", checkpoint, "--no-engine-process", "--port", str(port), "--log-level", "warning"]
    app([*args, *flags])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", default="8,32,64")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--floor-ms", type=float, default=FLOOR_MS)
    parser.add_argument("--token-ms", type=float, default=TOKEN_MS)
    parser.add_argument("--workload", default="standard")
    parser.add_argument("--fresh", action="store_true", help="no warm-up level: the first minute is measured")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # after --: more `canvasread serve` flags
    args, flags = parser.parse_args(argv[:split]), argv[split + 1 :]
    if args.serve:
        serve(args.checkpoint, PORT, args.floor_ms, args.token_ms, flags)
        return
    pacing = ["--floor-ms", str(args.floor_ms), "--token-ms", str(args.token_ms)]
    command = [sys.executable, __file__, args.checkpoint, str(args.out), *pacing, "--serve", "--", *flags]
    server = subprocess.Popen(command)
    url = f"http://127.0.0.1:{PORT}"
    try:
        wait_ready(url, server.poll)
        sweep = [sys.executable, str(Path(__file__).parent / "http_sweep.py"), url, Path(args.checkpoint).name]
        sweep += [str(args.out), "--workload", args.workload, "--levels", args.levels]
        sweep += ["--duration", str(args.duration), "--server-command", " ".join(command)]
        sweep += ["--fresh"] if args.fresh else []
        subprocess.run(sweep, check=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    report = json.loads(args.out.read_text())
    for level in report.get("engine_per_level", []):  # (think-beside reports its two rows, not the engine's)
        level["line_ms_per_pass"] = args.floor_ms + args.token_ms * level["engine_tokens_per_pass"]
    report["pacing"] = {"floor_ms": args.floor_ms, "token_ms": args.token_ms, "command": " ".join(sys.argv)}
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
