"""`canvasread banking77`, `eval` and `calibrate` end to end through the real CLI, in process and over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_one_line_error, canvasread

from canvasread.backends.sparrow import SparrowBackend

# A 231-row subset of the test split that ships with the tests (see its SOURCE.txt and LICENSE).
BANKING77 = Path(__file__).resolve().parents[1] / "data" / "banking77"
HEADLINE = ("n", "accuracy", "ece", "brier", "log_loss", "latency_p50_ms", "latency_p95_ms")


@pytest.fixture(scope="module")
def slice_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One message per intent from the Banking77 test split: 77 decisions."""
    path = tmp_path_factory.mktemp("banking77") / "slice.jsonl"
    result = canvasread("banking77", str(path), "--source", str(BANKING77), "--split", "test", "--per-intent", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CC BY 4.0" in result.stdout
    return path


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def test_eval_in_process_writes_report_summary_and_plot(slice_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = canvasread("eval", str(slice_path), "--limit", "12", "--order-check", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = _report(out)
    assert all(isinstance(report[key], int | float) for key in (*HEADLINE, "flip_rate", "mean_probability_shift"))
    assert report["n"] == 12 and report["order_checked"] == 12 and report["errors"] == 0
    assert sum(b["count"] for b in report["ece_bins"]) == 12 and len(report["ece_bins"]) == 10
    assert 0 <= report["accuracy"] <= 1 and 0 <= report["ece"] <= 1
    assert 0 < report["latency_p50_ms"] <= report["latency_p95_ms"]
    # sparrow pools options symmetrically, so reordered reads mapped back to their labels barely move;
    # a mistake in mapping answers back to the caller's labels would show here as large shifts
    assert report["mean_probability_shift"] < 1e-5
    assert report["run"]["command"].startswith("canvasread eval ")
    assert report["run"]["model"] == "sparrow-nano-general-v1.1"
    assert (out / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| accuracy |" in (out / "report.md").read_text()


def test_eval_over_http_matches_in_process(slice_path: Path, tmp_path: Path, sparrow_server: str) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    for out, extra in ((local, ()), (remote, ("--url", sparrow_server))):
        result = canvasread("eval", str(slice_path), "--limit", "6", "--order", "rotate", "--out", str(out), *extra)
        assert result.returncode == 0, result.stdout + result.stderr
    first, second = _report(local), _report(remote)
    assert second["run"]["source"] == sparrow_server and second["run"]["order"] == "rotate"
    assert (first["n"], first["accuracy"]) == (second["n"], second["accuracy"])
    for key in ("ece", "brier", "log_loss"):  # the server batches reads otherwise, so float rounding differs
        assert second[key] == pytest.approx(first[key], rel=1e-6)


def test_eval_counts_abstentions(slice_path: Path, tmp_path: Path) -> None:
    counts = []
    for threshold in ("0", "1"):
        out = tmp_path / threshold
        result = canvasread("eval", str(slice_path), "--limit", "6", "--min-confidence", threshold, "--out", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        counts.append(_report(out)["abstentions"])
    assert counts == [0, 6]  # with 77 options confidence reaches 1 only for a one-hot read


def test_calibrate_then_evaluate_with_the_file(slice_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    result = canvasread("calibrate", str(slice_path), "--holdout", "0.3", "--out", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    calibration = json.loads(path.read_text())
    assert calibration["model"] == "sparrow-nano-general-v1.1"
    assert calibration["fingerprint"] == SparrowBackend().fingerprint
    assert list(calibration["temperatures"]) == ["choice/65-128"]
    held_out = calibration["fit"]["held_out"]
    assert held_out["n"] == calibration["fit"]["buckets"]["choice/65-128"]["n_held_out"] > 0
    assert held_out["log_loss_after"] != held_out["log_loss_before"]
    assert "choice/65-128" in result.stdout
    for column in ("ECE", "log loss", "Brier"):
        assert column in result.stdout
    before, after = held_out["log_loss_before"], held_out["log_loss_after"]
    assert f"{before:.4f} → {after:.4f}" in result.stdout  # the `all` row: log loss before → after

    plain, calibrated = tmp_path / "plain", tmp_path / "calibrated"
    for out, extra in ((plain, ()), (calibrated, ("--calibration", str(path)))):
        result = canvasread("eval", str(slice_path), "--limit", "10", "--out", str(out), *extra)
        assert result.returncode == 0, result.stdout + result.stderr
    before, after = _report(plain), _report(calibrated)
    assert after["run"]["calibration"] == str(path)
    assert after["accuracy"] == before["accuracy"]  # a temperature never changes the top answer
    assert after["log_loss"] != before["log_loss"]


def test_eval_refuses_a_calibration_for_a_server_and_bad_data(slice_path: Path, tmp_path: Path) -> None:
    result = canvasread("eval", str(slice_path), "--url", "http://127.0.0.1:9", "--calibration", str(slice_path))
    assert_one_line_error(result, "serve --calibration")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "state": "s", "question": {"type": "noul", "instructions": "?"}, "expected": "maybe"}\n')
    result = canvasread("eval", str(bad), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, "bad.jsonl:1")


@pytest.mark.parametrize("command", ["eval", "calibrate"])
def test_a_line_that_is_not_json_is_named_by_file_and_line(tmp_path: Path, command: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": 1, "state": "s", "question": {"type": "noul", "instructions": "?"}, "expected": true}\nnotjson\n'
    )
    result = canvasread(command, str(bad), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, f"{bad}:2: not JSON (Expecting value at column 1)")


def test_eval_without_matplotlib_writes_the_reports_and_says_what_the_plot_needs(
    slice_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = canvasread("eval", str(slice_path), "--limit", "3", "--out", str(out), without=("matplotlib",))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stderr.lstrip().startswith("warning: the reliability diagram needs matplotlib")  # said first
    assert "pip install 'canvasread[plots]'" in result.stderr
    assert _report(out)["n"] == 3 and "| accuracy |" in (out / "report.md").read_text()
    assert not (out / "reliability.png").exists() and "reliability.png" not in result.stdout


def test_calibrate_shows_bucket_names_and_the_fingerprint_whole_at_80_columns(slice_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "calibration.json"
    result = canvasread("calibrate", str(slice_path), "--out", str(out), columns=80)
    assert result.returncode == 0, result.stdout + result.stderr
    fitted = json.loads(out.read_text())
    cells = {cell.strip() for line in result.stdout.splitlines() for cell in line.split("│")}
    assert set(fitted["fit"]["buckets"]) <= cells and fitted["fit"]["buckets"]
    assert f"(fingerprint {fitted['fingerprint']})" in result.stdout  # on one line, to copy


def test_banking77_needs_its_source_folder(tmp_path: Path) -> None:
    """No default that points outside the repository: the folder is named on the command line (issue 15.1)."""
    result = canvasread("banking77", str(tmp_path / "out.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--source" in result.stderr and not (tmp_path / "out.jsonl").exists()
