"""`canvasread bench` asks the server once before its sweep: a server it cannot use ends it in one line and exit 1,
not in minutes of failed requests, a report of zeros and exit 0."""

from __future__ import annotations

from pathlib import Path

from helpers import assert_one_line_error, canvasread

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there
QUICK = ("--concurrency", "1", "--duration", "1")


def test_a_server_it_cannot_reach_ends_bench_before_the_sweep(tmp_path: Path) -> None:
    result = canvasread("bench", "--url", CLOSED, *QUICK, "--out", str(tmp_path / "out"), timeout=60)
    assert_one_line_error(result, "cannot reach http://127.0.0.1:9", "refused")
    assert not (tmp_path / "out").exists()


def test_a_model_the_server_does_not_serve_ends_bench_with_the_servers_words(
    sparrow_server: str, tmp_path: Path
) -> None:
    result = canvasread("bench", "--url", sparrow_server, "--model", "nope", *QUICK, "--out", str(tmp_path), timeout=60)
    assert_one_line_error(result, "HTTP 400", "Unknown model: nope")
    assert not (tmp_path / "bench.json").exists()


def test_a_baseline_model_the_server_does_not_serve_is_found_before_the_first_sweep(
    sparrow_server: str, tmp_path: Path
) -> None:
    flags = ("--baseline-model", "nope-naive", "--baseline-concurrency", "1")
    result = canvasread("bench", "--url", sparrow_server, *QUICK, *flags, "--out", str(tmp_path), timeout=60)
    assert_one_line_error(result, "Unknown model: nope-naive")
    assert "decisions/s" not in result.stdout  # no level was swept
