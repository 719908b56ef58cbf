"""`canvasread bench` runs against live servers on this CPU machine and writes well-formed results (not the numbers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import canvasread, serve_cli

from canvasread.tools.workloads import answers_every_question, span_body, steps_body

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


def test_the_span_workload_is_answered_whole_by_a_canvas_model(tiny_server: str) -> None:
    """The benchmark's span row: the standard questions and a span question, each answered, the span a substring."""
    body = span_body(3)
    response = httpx.post(tiny_server + "/v1/systemone", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answers_every_question(body, answer)
    signed = answer["answers"]["signed"]
    assert body["state"][signed["start"] : signed["end"]] == signed["text"]


def test_the_steps_workload_sweeps_a_canvas_model_through_the_gpu_benchmarks_script(
    tiny_server: str, tmp_path: Path
) -> None:
    """The benchmark's steps4 row, as `bench/gpu_bench.sh` runs it: one second of `bench/http_sweep.py`."""
    out = tmp_path / "bench-bf16-steps4.json"
    script = Path(__file__).resolve().parents[2] / "bench" / "http_sweep.py"
    command = [sys.executable, str(script), tiny_server, "jev-latest", str(out), "--workload", "steps4"]
    command += ["--server-command", "canvasread serve --model tiny", "--levels", "1", "--duration", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["workload"] == "steps4" and report["request_example"]["steps"] == 4
    [level] = report["sweep"]
    assert level["errors"] == 0 and level["requests_ok"] > 0
    [engine] = report["engine_per_level"]
    assert engine["engine_passes_per_s"] > 0 and engine["engine_flat_share"] == 0  # a CPU's passes attend in groups
    body = steps_body(5)
    answer = httpx.post(tiny_server + "/v1/systemone", json={**body, "diagnostics": True}, timeout=120).json()
    assert answers_every_question(body, answer)
    assert {a["diagnostics"]["steps"] for a in answer["answers"].values()} == {4}


def test_bench_without_matplotlib_says_it_skips_the_plot(sparrow_server: str, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    flags = ("--concurrency", "1", "--duration", "0.5", "--out", str(out))
    result = canvasread("bench", "--url", sparrow_server, *flags, without=("matplotlib",))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stderr.lstrip().startswith("warning: the bench.png plot needs matplotlib")  # said first
    assert "pip install 'canvasread[plots]'" in result.stderr
    assert (out / "bench.json").exists() and not (out / "bench.png").exists()


def test_the_think_beside_row_runs_through_the_gpu_benchmarks_script(tiny_thinking_server: str, tmp_path: Path) -> None:
    """Issue 24's think-beside row, as `bench/gpu_bench.sh` runs it: standard clients alone, then beside thinkers."""
    out = tmp_path / "bench-bf16-think-beside.json"
    script = Path(__file__).resolve().parents[2] / "bench" / "http_sweep.py"
    command = [sys.executable, str(script), tiny_thinking_server, "jev-latest", str(out), "--workload", "think-beside"]
    command += ["--server-command", "canvasread serve --model tiny", "--levels", "2", "--duration", "1"]
    result = subprocess.run([*command, "--thinkers", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "think-beside 2 standard clients" in result.stdout
    report = json.loads(out.read_text())
    assert report["workload"] == "think-beside" and report["thinkers"] == 2 and report["interrupted"] is False
    [row] = report["levels"]
    assert row["concurrency"] == 2
    for phase in ("alone", "beside", "think"):
        assert row[phase]["requests_ok"] > 0 and row[phase]["errors"] == 0, (phase, row[phase])
    assert row["think"]["concurrency"] == 2 and row["think_requests_per_s"] > 0
    assert row["p95_ratio"] == pytest.approx(row["beside_p95_ms"] / row["alone_p95_ms"])
    assert report["worst_p95_ratio"] == row["p95_ratio"]
    assert report["compiles_after_ready"] == 0 and report["graph_misses"] == 0
