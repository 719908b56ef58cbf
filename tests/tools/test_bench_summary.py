"""The benchmark's summaries on made-up levels: shed and errors apart, the knee's goodput past it, think-beside."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from canvasread.eval.metrics import quantile
from canvasread.tools.bench import Level, best_within_budget, goodput_past_knee, summarise
from canvasread.tools.beside import BESIDE_P95_RISE_TARGET, Beside, summarise_beside
from canvasread.tools.loadgen import LoadPlan, LoadReport, drive, retry_delay_s


def level(concurrency: int, decisions_per_s: float, p95_ms: float | None, *, shed: int = 0, errors: int = 0) -> Level:
    return Level(
        concurrency=concurrency,
        requests_ok=100,
        shed=shed,
        errors=errors,
        statuses={"200": 100},
        transport_errors={},
        decisions_per_s=decisions_per_s,
        requests_per_s=decisions_per_s / 3,
        p50_ms=None if p95_ms is None else p95_ms / 2,
        p95_ms=p95_ms,
        p99_ms=p95_ms,
        max_ms=p95_ms,
        elapsed_s=4.0,
    )


def test_a_level_counts_shed_answers_apart_from_errors_and_times_admitted_requests_only() -> None:
    report = LoadReport(
        sent=30,
        statuses=Counter({200: 20, 529: 6, 500: 1}),
        transport_errors=Counter({"ReadTimeout": 3}),
        shed_without_retry_hint=2,  # two of the 529s came without retry-after-ms / Retry-After: a server bug
        latencies_s={200: [0.1 + 0.01 * n for n in range(20)], 529: [0.001] * 6, 500: [0.002]},
        elapsed_s=2.0,
    )
    made = Level.from_report(8, report, decisions=60)
    assert (made.requests_ok, made.shed, made.errors) == (20, 4, 6)  # errors: 1 x 500, 2 hintless 529s, 3 timeouts
    assert made.transport_errors == {"ReadTimeout": 3}
    assert made.statuses == {"200": 20, "500": 1, "529": 6}
    admitted = [1000 * (0.1 + 0.01 * n) for n in range(20)]
    assert made.p95_ms == pytest.approx(quantile(admitted, 0.95))
    assert made.p50_ms == pytest.approx(quantile(admitted, 0.50))
    assert made.max_ms == pytest.approx(290.0)
    assert (made.decisions_per_s, made.requests_per_s) == (30.0, 10.0)


def test_the_knee_is_the_best_level_within_the_p95_budget_with_nothing_shed_or_failed() -> None:
    levels = [
        level(1, 70, 40),
        level(8, 200, 130),
        level(16, 380, 390, shed=1),  # shed some: not every request was served, so no knee
        level(32, 330, 360),
        level(48, 390, 380, errors=2),
        level(64, 420, 1900),  # faster, but past the budget
    ]
    knee = best_within_budget(levels)
    assert knee is not None and knee.concurrency == 32


def test_goodput_past_the_knee_is_the_level_at_four_times_its_clients_over_the_knee() -> None:
    levels = [level(1, 70, 40), level(32, 320, 360), level(64, 260, 1900), level(128, 240, 3500, shed=15)]
    goodput = goodput_past_knee(levels)
    assert goodput == {
        "knee_concurrency": 32,
        "knee_decisions_per_s": 320,
        "concurrency_at_4x_knee": 128,
        "decisions_per_s_at_4x_knee": 240,
        "p95_ms_at_4x_knee": 3500,
        "shed_at_4x_knee": 15,
        "errors_at_4x_knee": 0,
        "goodput_at_4x_knee_ratio": pytest.approx(0.75),
    }


def test_goodput_past_the_knee_is_none_when_that_level_was_not_run_or_there_is_no_knee() -> None:
    not_run = goodput_past_knee([level(1, 70, 40), level(64, 420, 380), level(128, 400, 900)])
    assert not_run["knee_concurrency"] == 64 and not_run["concurrency_at_4x_knee"] == 256
    assert not_run["decisions_per_s_at_4x_knee"] is None and not_run["goodput_at_4x_knee_ratio"] is None
    no_knee = goodput_past_knee([level(1, 70, 450), level(4, 90, None)])
    assert set(no_knee.values()) == {None}
    assert set(no_knee) == set(not_run)  # the same keys whatever was measured


def test_the_results_file_holds_the_goodput_keys_and_the_shed_total() -> None:
    levels = [level(4, 100, 90), level(16, 120, 300, shed=3), level(64, 110, 350, shed=9)]
    result = summarise(levels, [], command="bench", gpu="test")
    assert result["knee_concurrency"] == 4 and result["decisions_per_s"] == 100  # the knee is the headline figure
    assert result["goodput_at_4x_knee_ratio"] == pytest.approx(1.2)
    assert result["shed_at_4x_knee"] == 3 and result["shed"] == 12
    assert [lv["shed"] for lv in result["sweep"]] == [0, 3, 9]


def beside(alone_p95: float | None, beside_p95: float | None, *, thoughts: int = 4, errors: int = 0) -> Beside:
    think = level(8, 0.5, 9000)
    think = Level(**{**vars(think), "requests_ok": thoughts})
    return Beside(
        alone=level(8, 200, alone_p95), beside=level(8, 150, beside_p95, errors=errors), think=think, thinkers=8
    )


def test_beside_reports_how_far_the_standard_p95_rose_against_the_issues_target() -> None:
    within = beside(100.0, 118.0).summary()
    assert within["p95_ratio"] == pytest.approx(1.18) and within["p50_ratio"] == pytest.approx(1.18)
    assert within["meets_target"] is True and within["p95_rise_target"] == BESIDE_P95_RISE_TARGET == 1.2
    assert (within["alone_p95_ms"], within["beside_p95_ms"]) == (100.0, 118.0)
    assert (within["think_p95_ms"], within["think_requests_per_s"]) == (9000, pytest.approx(0.5 / 3))
    assert within["think"]["requests_ok"] == 4 and within["concurrency"] == 8 and within["thinkers"] == 8
    assert beside(100.0, 121.0).summary()["meets_target"] is False


@pytest.mark.parametrize(
    "case",
    [
        beside(100.0, 101.0, thoughts=0),  # no thought was written: the standard clients were never beside one
        beside(100.0, 101.0, errors=1),  # a standard request failed beside the thinkers
        beside(100.0, None),  # none was answered
    ],
)
def test_beside_misses_its_target_when_the_comparison_does_not_hold(case: Beside) -> None:
    assert case.summary()["meets_target"] is False


def test_the_beside_results_file_holds_the_worst_rise_and_meets_the_target_only_at_every_level() -> None:
    result = summarise_beside([beside(100.0, 110.0), beside(200.0, 250.0)], command="bench", gpu="test")
    assert result["workload"] == "think-beside" and result["thinkers"] == 8
    assert result["worst_p95_ratio"] == pytest.approx(1.25) and result["meets_target"] is False
    assert [lv["p95_ratio"] for lv in result["levels"]] == [pytest.approx(1.1), pytest.approx(1.25)]
    assert result["request_example"]["think"]["think"] == 32 and "think" not in result["request_example"]["standard"]
    assert summarise_beside([beside(100.0, 110.0)], command="bench", gpu="test")["meets_target"] is True
    assert summarise_beside([], command="bench", gpu="test")["meets_target"] is False


def test_a_529s_retry_hint_is_read_in_milliseconds_first_then_seconds() -> None:
    assert retry_delay_s(httpx.Headers({"retry-after-ms": "250", "Retry-After": "1"})) == 0.25
    assert retry_delay_s(httpx.Headers({"Retry-After": "2"})) == 2.0
    assert retry_delay_s(httpx.Headers({"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"})) is None
    assert retry_delay_s(httpx.Headers({})) is None


class _Overloaded(BaseHTTPRequestHandler):
    """Answers every POST with a 529 asking the client to come back in 10 s."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(529)
        self.send_header("retry-after-ms", "10000")
        self.send_header("Retry-After", "10")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def overloaded() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Overloaded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_client_that_honours_retry_after_waits_out_the_plan_instead_of_retrying(overloaded: str) -> None:
    """Told to wait 10 s, each honouring client sends once in a 0.5 s plan (its wait ends with the plan);
    without honouring, each sends again at once."""
    patient = asyncio.run(drive(LoadPlan(overloaded, concurrency=2, duration_s=0.5, honour_retry_after=True)))
    assert patient.statuses == Counter({529: 2}) and patient.sent == 2
    eager = asyncio.run(drive(LoadPlan(overloaded, concurrency=2, duration_s=0.5)))
    assert eager.sent > 2 and set(eager.statuses) == {529} and eager.shed_without_retry_hint == 0
