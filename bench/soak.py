"""Soak: drive a real `canvasread serve` past saturation and check that it holds.

Starts the server on a free loopback port with a small queue, pushes more
concurrent clients at it than the queue takes (`canvasread.tools.loadgen`), samples
the server's resident memory once a second, then stops it with SIGTERM.
It passes when every request got exactly its own answer or a 529 with a retry
hint, both kinds occurred (so the server really was past saturation), memory
stayed flat after warm-up, and the server exited cleanly.

    python bench/soak.py                   # 10 minutes (`make soak`)
    python bench/soak.py --duration 15     # the CI version (tests/test_overload.py)

Prints one JSON object; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from canvasread.tools.loadgen import LoadPlan, LoadReport, drive

# Memory may grow this much past its post-warm-up level (allocator arenas settle; a leak keeps going).
ALLOWED_GROWTH_BYTES = 32 * 1024 * 1024
ALLOWED_GROWTH_FRACTION = 0.10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resident_bytes(pid: int) -> int:
    """VmRSS from /proc (Linux), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def heavy_body(questions: int) -> Any:
    """Requests of several questions, so the model (not HTTP) is what saturates.

    The sequence number goes in the question keys (which the answers must echo)
    but the text the model reads repeats: sparrow's tokenizer caches up to 65,536
    words, and ever-new words would show that cache filling up as memory growth.
    """

    def make(sequence: int) -> dict[str, Any]:
        return {
            "model": "jev-latest",
            "state": f"Ticket {sequence % 97}: I was charged twice for my order and want my money back.",
            "questions": {
                f"r{sequence}-{i}": {"type": "noul", "instructions": f"Is the customer asking for refund #{i}?"}
                for i in range(questions)
            },
        }

    return make


def wait_ready(base: str, exit_code: Callable[[], int | None], timeout: float = 120.0) -> None:
    """Poll `base`/ready until it answers 200; `exit_code` is the server process's (None while it runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (code := exit_code()) is not None:
            raise RuntimeError(f"the server exited with {code} before it was ready")
        try:
            if httpx.get(base + "/ready", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{base} was not ready within {timeout}s")


async def sample_memory(pid: int, samples: list[tuple[float, int]], started: float, every_s: float) -> None:
    while True:
        samples.append((time.monotonic() - started, resident_bytes(pid)))
        await asyncio.sleep(every_s)


def memory_verdict(samples: list[tuple[float, int]], duration_s: float) -> dict[str, Any]:
    """Median RSS over the window right after warm-up (10–20% of the run) against the last 10%."""
    early = [rss for t, rss in samples if 0.1 * duration_s <= t <= 0.2 * duration_s]
    late = [rss for t, rss in samples if t >= 0.9 * duration_s]
    if not early or not late:
        return {"ok": False, "reason": "too few memory samples"}
    baseline, final = statistics.median(early), statistics.median(late)
    allowed = max(ALLOWED_GROWTH_BYTES, ALLOWED_GROWTH_FRACTION * baseline)
    mib = 1024 * 1024
    return {
        "ok": final - baseline <= allowed,
        "baseline_mib": round(baseline / mib, 1),
        "final_mib": round(final / mib, 1),
        "peak_mib": round(max(rss for _, rss in samples) / mib, 1),
        "growth_mib": round((final - baseline) / mib, 1),
        "allowed_growth_mib": round(allowed / mib, 1),
        "median_mib_by_tenth": [
            round(statistics.median(tenth) / mib, 1)
            for k in range(10)
            if (tenth := [rss for t, rss in samples if k * duration_s / 10 <= t < (k + 1) * duration_s / 10])
        ],
    }


async def soak(base: str, pid: int, args: argparse.Namespace) -> tuple[LoadReport, list[tuple[float, int]]]:
    samples: list[tuple[float, int]] = []
    # Fifty samples a run, at most one a second: a short run's early and late tenths each get several.
    every_s = min(1.0, args.duration / 50)
    sampler = asyncio.create_task(sample_memory(pid, samples, time.monotonic(), every_s))
    plan = LoadPlan(base, concurrency=args.concurrency, duration_s=args.duration, timeout_s=args.timeout)
    try:
        report = await drive(plan, heavy_body(args.questions))
    finally:
        sampler.cancel()
    return report, samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default: 10 minutes)")
    parser.add_argument("--concurrency", type=int, default=64, help="clients, each with one request in flight")
    parser.add_argument("--max-pending", type=int, default=16, help="the server's queue; below --concurrency")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--questions", type=int, default=8, help="questions per request")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout per request")
    parser.add_argument("--model", default=None, help="model to serve (default: the embedded sparrow)")
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args(argv)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "canvasread", "serve", "--port", str(port), "--log-level", "warning"]
    command += ["--max-pending", str(args.max_pending), "--max-batch", str(args.max_batch)]
    command += ["--model", args.model] if args.model else []
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a chatty server must never block on it
        server = subprocess.Popen(command, stdout=log, stderr=log)
        try:
            wait_ready(base, server.poll)
            report, samples = asyncio.run(soak(base, server.pid, args))
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log.seek(0)
        server_log = log.read().decode(errors="replace")

    memory = memory_verdict(samples, args.duration)
    problems = report.problems()
    if not report.statuses[200] or not report.statuses[529]:
        problems.append(f"not past saturation: {dict(report.statuses)} (raise --concurrency or --questions)")
    if not memory["ok"]:
        problems.append(f"memory grew: {memory}")
    if server.returncode not in (0, -signal.SIGTERM):  # uvicorn re-raises SIGTERM once it has shut down
        problems.append(f"the server exited with {server.returncode}: {server_log[-2000:]}")
    result = {
        "command": " ".join(["python", "bench/soak.py", *(argv if argv is not None else sys.argv[1:])]),
        "cpus": os.cpu_count(),
        "load": report.summary(),
        "memory": memory,
        "server_exit_code": server.returncode,
        "problems": problems,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
