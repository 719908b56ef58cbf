"""`canvasread bench` runs against live servers on this CPU machine and writes well-formed results (not the numbers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import serve_cli

REQUIRED_KEYS = {
    "gpu",
    "date",
    "command",
    "single_client_p50_ms",
    "decisions_per_s",
    "p95_ms_at_best",
    "naive_single_client_p50_ms",
    "naive_decisions_per_s",
    "sweep",
}


def run_bench(url: str, out: Path, *extra: str) -> dict[str, object]:
    command = [
        sys.executable,
        "-m",
        "canvasread",
        "bench",
        "--url",
        url,
        "--concurrency",
        "1,2",
        "--duration",
        "1",
        "--gpu",
        "cpu (test)",
        "--out",
        str(out),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "decisions/s" in result.stdout
    report: dict[str, object] = json.loads((out / "bench.json").read_text())
    assert set(report) >= REQUIRED_KEYS
    assert (out / "bench.png").stat().st_size > 1000
    return report


def test_bench_against_the_embedded_default(sparrow_server: str, tmp_path: Path) -> None:
    report = run_bench(sparrow_server, tmp_path)
    sweep = report["sweep"]
    assert isinstance(sweep, list) and [level["concurrency"] for level in sweep] == [1, 2]
    for level in sweep:
        assert level["errors"] == 0 and level["requests_ok"] > 0
        assert level["p50_ms"] <= level["p95_ms"] <= level["p99_ms"]
        assert level["decisions_per_s"] == pytest.approx(level["requests_per_s"] * 3)


def test_bench_with_the_naive_baseline_on_the_tiny_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serve_cli("--model", str(tiny_checkpoint), "--naive-baseline") as base:
        name = tiny_checkpoint.name
        report = run_bench(
            base, tmp_path, "--model", name, "--baseline-model", f"{name}-naive", "--baseline-concurrency", "1"
        )
    assert report["naive_single_client_p50_ms"] is not None
    assert isinstance(report["naive_sweep"], list) and len(report["naive_sweep"]) == 1
