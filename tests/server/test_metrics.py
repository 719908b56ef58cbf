"""`GET /metrics` against live servers: every series is there and moves when requests are made."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import helpers
import httpx
from helpers import serve_app
from prometheus_client.parser import text_string_to_metric_families

from canvasread.backends.base import FunctionBackend, Gone, never_gone
from canvasread.decide import Decider
from canvasread.server.app import create_app
from canvasread.server.metrics import FoldedHistogram
from canvasread.types import DecisionRequest, DecisionResult, Distribution

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

QUESTIONS = {
    "easy": {"type": "noul", "instructions": "Is this about money?"},
    "hard": {"type": "choice", "criteria": {"billing": None, "technical": None, "sales": None}},
    "level": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
}


def rising(request: DecisionRequest) -> list[list[float]]:
    """p_i ∝ i + 1: never uniform, so every answer has a clear top option."""
    return [[(i + 1) / sum(range(1, len(q.options) + 1)) for i in range(len(q.options))] for q in request.questions]


class CountingBackend(FunctionBackend):
    """Reports reads the way the canvas backend does: question `hard` is re-read twice, the others read once."""

    def __init__(self) -> None:
        super().__init__(rising, name="counting")
        self.totals = {"reads": 0.0, "rereads": 0.0, "encoder-runs": 0.0, "graph_misses/not_captured": 2.0}
        self.totals["kv_store_free_pages"] = 7.0  # a level (`LEVELS`), not a total

    def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
        results = []
        for request, result in zip(jobs, super().decide(jobs, gone), strict=True):
            distributions = []
            for question, distribution in zip(request.questions, result.distributions, strict=True):
                reads = 3 if question.key == "hard" else 1
                self.totals["reads"] += reads
                self.totals["rereads"] += reads - 1
                distributions.append(Distribution(distribution.probabilities, {"reads": reads}, reads=reads))
            self.totals["encoder-runs"] += 1
            results.append(DecisionResult(tuple(distributions), result.usage))
        return results

    def counters(self) -> Mapping[str, float]:
        return dict(self.totals)


def scrape(base: str) -> Samples:
    response = httpx.get(base + "/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; a labelled series that was never touched does not exist yet, which reads as 0."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def post(base: str, questions: dict[str, Any], model: str = "jev-latest") -> httpx.Response:
    return helpers.post(base, {"model": model, "state": "I was charged twice.", "questions": questions})


def test_request_series_move_with_requests() -> None:
    backend = CountingBackend()
    with serve_app(create_app(Decider([backend]))) as base:
        before = scrape(base)
        assert post(base, QUESTIONS).status_code == 200
        assert post(base, QUESTIONS).status_code == 200
        assert post(base, {"bad": {"type": "choice", "criteria": {}}}).status_code == 422
        assert httpx.get(base + "/no/such/page/1182", timeout=10).status_code == 404
        after = scrape(base)

    route = {"route": "/v1/systemone", "method": "POST"}
    assert moved(before, after, "canvasread_http_requests_total", **route, status="200") == 2
    assert moved(before, after, "canvasread_http_requests_total", **route, status="422") == 1
    assert moved(before, after, "canvasread_http_request_duration_seconds_count", **route) == 3
    assert moved(before, after, "canvasread_http_request_duration_seconds_sum", **route) > 0
    # Unknown paths share one label value, so scanners cannot blow up the series count.
    assert moved(before, after, "canvasread_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert not any("1182" in str(labels) for _, labels in after)

    for kind in ("noul", "choice", "score"):
        assert moved(before, after, "canvasread_decisions_total", model="counting", type=kind) == 2
    assert moved(before, after, "canvasread_decision_duration_seconds_count", model="counting") == 2
    assert moved(before, after, "canvasread_request_questions_count", model="counting") == 2
    assert moved(before, after, "canvasread_request_questions_sum", model="counting") == 6

    # Each request's most re-read question took 3 reads; one question per request was re-read.
    assert moved(before, after, "canvasread_request_reads_count", model="counting") == 2
    assert moved(before, after, "canvasread_request_reads_sum", model="counting") == 6
    assert moved(before, after, "canvasread_request_reads_bucket", model="counting", le="2.0") == 0
    assert moved(before, after, "canvasread_request_reads_bucket", model="counting", le="3.0") == 2
    assert moved(before, after, "canvasread_reread_questions_total", model="counting") == 2


def test_decider_series_read_the_queues_and_backend_counters() -> None:
    backend = CountingBackend()
    with serve_app(create_app(Decider([backend]))) as base:
        before = scrape(base)
        for _ in range(3):
            assert post(base, QUESTIONS).status_code == 200
        after = scrape(base)

    model = {"model": "counting"}
    assert value(after, "canvasread_engine_reads_total", **model) == backend.totals["reads"] == 15
    assert moved(before, after, "canvasread_engine_reads_total", **model) == 15
    assert value(after, "canvasread_engine_rereads_total", **model) == 6
    assert value(after, "canvasread_engine_encoder_runs_total", **model) == 3
    # "name/reason" counters are one series per reason.
    assert value(after, "canvasread_engine_graph_misses_total", **model, reason="not_captured") == 2
    # A level is a gauge: no `_total`, which would tell Prometheus it never falls.
    assert value(after, "canvasread_engine_kv_store_free_pages", **model) == 7
    assert not any(name == "canvasread_engine_kv_store_free_pages_total" for name, _ in after)

    assert value(after, "canvasread_batches_total", **model) == len(backend.batches)
    assert value(after, "canvasread_batch_jobs_total", **model) == sum(backend.batches) == 3
    assert value(after, "canvasread_batch_size_count", **model) == len(backend.batches)
    assert value(after, "canvasread_batch_size_sum", **model) == 3
    assert value(after, "canvasread_queue_depth", **model) == 0
    assert value(after, "canvasread_queue_limit", **model) == 1024

    assert value(after, "canvasread_model_loaded", **model) == 1
    assert value(after, "canvasread_model_load_seconds", **model) >= 0
    info = {
        "model": "counting",
        "release_date": "2026-01-01",
        "default": "true",
        "images": "false",
        "max_options": "255",
        "max_levels": "10",
    }
    assert value(after, "canvasread_model_info", **info) == 1
    assert any(name == "canvasread_build_info" for name, _ in after)


def test_queue_depth_and_batch_sizes_follow_a_backlog() -> None:
    running, release = threading.Event(), threading.Event()

    class Gated(FunctionBackend):
        def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
            running.set()
            release.wait(timeout=30)
            return super().decide(jobs, gone)

    backend = Gated(rising, name="gated")
    with serve_app(create_app(Decider([backend]))) as base:
        statuses: list[int] = []
        callers = [
            threading.Thread(target=lambda: statuses.append(post(base, {"q": QUESTIONS["easy"]}).status_code))
            for _ in range(3)
        ]
        callers[0].start()
        assert running.wait(timeout=30)
        for caller in callers[1:]:
            caller.start()
        deadline = time.monotonic() + 30
        while value(scrape(base), "canvasread_queue_depth", model="gated") < 3:
            assert time.monotonic() < deadline, "three requests never showed up in the queue depth"
            time.sleep(0.02)
        release.set()
        for caller in callers:
            caller.join(timeout=30)
        after = scrape(base)

    assert statuses == [200, 200, 200]
    assert value(after, "canvasread_queue_depth", model="gated") == 0
    # The first request ran alone; the two that waited behind it were read together.
    assert backend.batches == [1, 2]
    assert value(after, "canvasread_batch_size_bucket", model="gated", le="1.0") == 1
    assert value(after, "canvasread_batch_size_bucket", model="gated", le="2.0") == 2
    assert value(after, "canvasread_batch_size_sum", model="gated") == 3


def test_apps_in_one_process_keep_their_own_series() -> None:
    first, second = FunctionBackend(rising, name="first"), FunctionBackend(rising, name="second")
    with serve_app(create_app(Decider([first]))) as base_a, serve_app(create_app(Decider([second]))) as base_b:
        assert post(base_a, QUESTIONS).status_code == 200
        a, b = scrape(base_a), scrape(base_b)
    route = {"route": "/v1/systemone", "method": "POST", "status": "200"}
    assert value(a, "canvasread_http_requests_total", **route) == 1
    assert value(b, "canvasread_http_requests_total", **route) == 0
    assert value(b, "canvasread_model_loaded", model="second") == 1
    assert value(b, "canvasread_model_loaded", model="first") == 0


def test_a_backend_whose_counters_fail_does_not_break_the_scrape() -> None:
    class Broken(FunctionBackend):
        def counters(self) -> Mapping[str, float]:
            raise RuntimeError("counter storage is gone")

    with serve_app(create_app(Decider([Broken(rising, name="broken")]))) as base:
        samples = scrape(base)
    assert value(samples, "canvasread_model_loaded", model="broken") == 1
    assert not any(name.startswith("canvasread_engine_") for name, _ in samples)


def test_model_ready_falls_to_zero_when_the_backend_reports_it_died() -> None:
    """`canvasread_model_loaded` says the load once finished; `canvasread_model_ready` is what to alert on."""

    class Dying(FunctionBackend):
        problem: str | None = None

        def health_problem(self) -> str | None:
            return self.problem

    backend = Dying(rising, name="dying")
    with serve_app(create_app(Decider([backend]))) as base:
        alive = scrape(base)
        backend.problem = "the engine process has ended (exit code -9)"
        dead = scrape(base)
    assert value(alive, "canvasread_model_ready", model="dying") == 1
    assert value(dead, "canvasread_model_ready", model="dying") == 0
    assert value(dead, "canvasread_model_loaded", model="dying") == 1


def test_batch_histogram_folds_only_batches_it_has_not_seen() -> None:
    folded = FoldedHistogram()
    folded.fold(2, [1, 3])
    folded.fold(2, [1, 3])  # a scrape with no new batches adds nothing
    folded.fold(5, [3, 40])  # three new batches, but the queue kept only two
    buckets = dict(FoldedHistogram.sum_buckets([folded]))
    assert [buckets[le] for le in ("1.0", "2.0", "4.0", "32.0", "64.0", "+Inf")] == [1, 1, 3, 3, 4, 4]
    assert folded.total == 47


def test_a_models_lanes_add_up_to_one_histogram() -> None:
    reads, thoughts = FoldedHistogram(), FoldedHistogram()
    reads.fold(2, [1, 3])
    thoughts.fold(1, [40])
    buckets = dict(FoldedHistogram.sum_buckets([reads, thoughts]))
    assert [buckets[le] for le in ("1.0", "4.0", "32.0", "64.0", "+Inf")] == [1, 2, 2, 3, 3]
