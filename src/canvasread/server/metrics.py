"""`GET /metrics`: Prometheus series for the HTTP layer, the batch queues and the backends.

Every app gets its own `CollectorRegistry`, so several apps in one process
(the tests) never share or clash on series. Two kinds of sources:

- per request, pushed by `ObserveMiddleware`: requests by route and status,
  latency, answers by type, questions and reads per request, re-read
  questions (re-read rate = `canvasread_reread_questions_total` /
  `canvasread_decisions_total`);
- at scrape time, read by `DeciderCollector`: model info and load time, queue
  depth, batch counts and sizes, and the monotonic counters of backends that
  implement `ReportsCounters` (reads, re-reads, prefix-cache hits...).
"""

from __future__ import annotations

import logging
import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from canvasread import __version__
from canvasread.backends.base import LEVELS, ReportsCounters
from canvasread.decide import Decider
from canvasread.served import ServedModel
from canvasread.server.observe import RequestRecord, method_label

logger = logging.getLogger(__name__)

# From a sparrow read (~1 ms) to the default 120 s deadline.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Powers of two up to the largest request the server accepts (1024 questions) and a full queue of batches.
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# `samples` goes up to 16 reads per question.
READ_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)


class ServerMetrics:
    """The app's registry: per-request series recorded here, decider series collected at scrape time."""

    def __init__(self, decider: Decider) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "canvasread_http_requests",
            "HTTP requests by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "canvasread_http_request_duration_seconds",
            "Time from receiving a request to sending the last byte of its response.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decide_latency = Histogram(
            "canvasread_decision_duration_seconds",
            "Time the decider spent on an answered request, queue wait included.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "canvasread_decisions",
            "Questions answered, by model and question type.",
            ["model", "type"],
            registry=self.registry,
        )
        self.questions = Histogram(
            "canvasread_request_questions",
            "Questions per answered request.",
            ["model"],
            buckets=COUNT_BUCKETS,
            registry=self.registry,
        )
        self.reads = Histogram(
            "canvasread_request_reads",
            "Reads an answered request needed (its most re-read question); only backends that report reads.",
            ["model"],
            buckets=READ_BUCKETS,
            registry=self.registry,
        )
        self.rereads = Counter(
            "canvasread_reread_questions",
            "Answered questions that needed more than one read.",
            ["model"],
            registry=self.registry,
        )
        self.escalated = Counter(
            "canvasread_escalated_questions",
            "Questions re-asked of another model because the first answer was unsure (escalation), by both models.",
            ["model", "target"],
            registry=self.registry,
        )
        Info("canvasread_build", "The canvasread version serving.", registry=self.registry).info(
            {"version": __version__}
        )
        self.registry.register(DeciderCollector(decider))

    def record(self, record: RequestRecord) -> None:
        """The `ObserveMiddleware` sink."""
        method = method_label(record.method)
        self.requests.labels(record.route, method, str(record.status)).inc()
        self.latency.labels(record.route, method).observe(record.duration_s)
        decision = record.exchange.decision
        if decision is None:
            return
        model = decision.model
        self.decide_latency.labels(model).observe(decision.elapsed_s)
        self.questions.labels(model).observe(len(decision.answers))
        for answer in decision.answers.values():
            self.decisions.labels(model, str(answer["type"])).inc()
        if decision.reads:
            self.reads.labels(model).observe(max(decision.reads))
            self.rereads.labels(model).inc(sum(1 for reads in decision.reads if reads > 1))
        if decision.escalation is not None:
            self.escalated.labels(model, str(decision.escalation["model"])).inc(
                float(str(decision.escalation["questions"]))
            )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class FoldedHistogram:
    """A cumulative histogram built from `BatchStats.batch_sizes`, which keeps only the last 1024 batches.

    Each scrape folds in the batches finished since the previous one; if more
    than the queue keeps finished in between, the oldest are missed (the exact
    totals are still in `canvasread_batches_total` / `canvasread_batch_jobs_total`).
    """

    seen: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * (len(COUNT_BUCKETS) + 1))
    total: float = 0.0

    def fold(self, batches: int, recent: list[int]) -> None:
        fresh = min(batches - self.seen, len(recent))
        for size in recent[len(recent) - fresh :]:
            self.counts[bisect_left(COUNT_BUCKETS, size)] += 1
            self.total += size
        self.seen = batches

    @staticmethod
    def sum_buckets(histograms: list[FoldedHistogram]) -> list[tuple[str, float]]:
        """The cumulative buckets of several histograms taken as one (a model's lanes)."""
        counts = [sum(column) for column in zip(*(h.counts for h in histograms), strict=True)]
        cumulative, running = [], 0
        for bound, count in zip([*map(floatToGoString, COUNT_BUCKETS), "+Inf"], counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        return cumulative


def _metric_name(key: str) -> str:
    """A backend counter key as a metric name part (`prefix-cache hits` → `prefix_cache_hits`)."""
    name = re.sub(r"[^a-zA-Z0-9_]+", "_", key).strip("_").lower()
    return name.removesuffix("_total")


def _backend_family(counter: str, name: str, labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    """A backend counter's family: a counter (`_total`), or a gauge for a level (`LEVELS`), which can fall."""
    if counter in LEVELS:
        return GaugeMetricFamily(f"canvasread_engine_{name}", f"Backend level {counter!r}, now.", labels=labels)
    return CounterMetricFamily(
        f"canvasread_engine_{name}", f"Backend counter {counter!r}, total since load.", labels=labels
    )


class DeciderCollector(Collector):
    """Reads the decider's models, queues and backend counters at scrape time (on the event loop, like the queues)."""

    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self.batch_sizes: dict[str, FoldedHistogram] = {}

    def collect(self) -> Iterator[Metric]:
        served = self.decider.served
        yield from self._models(served)
        yield from self._queues(served)
        yield from self._backend_counters(served)

    def _models(self, served: list[ServedModel]) -> Iterable[Metric]:
        info = InfoMetricFamily("canvasread_model", "Served models and what they accept.", labels=["model"])
        loaded = GaugeMetricFamily("canvasread_model_loaded", "1 once the model has loaded.", labels=["model"])
        ready = GaugeMetricFamily(
            "canvasread_model_ready",
            "1 while the model can answer: loaded and its backend healthy (0 once, say, its engine process died).",
            labels=["model"],
        )
        load_time = GaugeMetricFamily(
            "canvasread_model_load_seconds", "How long loading the backend took.", labels=["model"]
        )
        for model in served:
            card = model.card
            info.add_metric(
                [card.name],
                {
                    "release_date": card.release_date,
                    "default": str(card.name == self.decider.default_name).lower(),
                    "images": str(card.capabilities.images).lower(),
                    "max_options": str(card.capabilities.max_options),
                    "max_levels": str(card.capabilities.max_levels),
                },
            )
            loaded.add_metric([card.name], float(model.loaded.is_set()))
            ready.add_metric([card.name], float(model.not_ready_reason() is None))
            if model.load_seconds is not None:
                load_time.add_metric([card.name], model.load_seconds)
        return info, loaded, ready, load_time

    def _queues(self, served: list[ServedModel]) -> Iterable[Metric]:
        labels = ["model"]
        depth = GaugeMetricFamily("canvasread_queue_depth", "Requests accepted and not yet answered.", labels=labels)
        limit = GaugeMetricFamily("canvasread_queue_limit", "Requests in flight before 529 Overloaded.", labels=labels)
        batches = CounterMetricFamily("canvasread_batches", "Batches the backend has run.", labels=labels)
        jobs = CounterMetricFamily("canvasread_batch_jobs", "Requests run inside batches.", labels=labels)
        dropped = CounterMetricFamily(
            "canvasread_batch_dropped_jobs", "Queued requests dropped because their caller had gone.", labels=labels
        )
        shed = CounterMetricFamily(
            "canvasread_shed_requests",
            "Requests answered 529 before any work: past --max-pending, or past --max-queue-delay of waiting.",
            labels=labels,
        )
        busy = CounterMetricFamily(
            "canvasread_backend_busy_seconds", "Time the backend spent on batches.", labels=labels
        )
        sizes = HistogramMetricFamily("canvasread_batch_size", "Requests per batch.", labels=labels)
        for model in served:  # a model's lanes (reads, thoughts) add up to its series
            name, queues, stats = model.card.name, model.queues, [queue.stats for queue in model.queues]
            depth.add_metric([name], sum(queue.pending for queue in queues))
            limit.add_metric([name], model.queue.settings.max_pending)
            batches.add_metric([name], sum(s.batches for s in stats))
            jobs.add_metric([name], sum(s.jobs for s in stats))
            dropped.add_metric([name], sum(s.dropped for s in stats))
            shed.add_metric([name], sum(s.shed for s in stats))
            busy.add_metric([name], sum(s.busy_s for s in stats))
            folded = [self.batch_sizes.setdefault(queue.name, FoldedHistogram()) for queue in queues]
            for histogram, lane in zip(folded, stats, strict=True):
                histogram.fold(lane.batches, lane.batch_sizes)
            sizes.add_metric([name], FoldedHistogram.sum_buckets(folded), sum(h.total for h in folded))
        return depth, limit, batches, jobs, dropped, shed, busy, sizes

    def _backend_counters(self, served: list[ServedModel]) -> Iterable[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for model in served:
            backend = model.backend
            if not isinstance(backend, ReportsCounters):
                continue
            try:
                counters = dict(backend.counters())
            except Exception:  # a broken counter must not take /metrics down with it
                logger.exception("reading the counters of %s failed", model.card.name)
                continue
            for key, value in counters.items():
                # "name/reason" keys are one counter with a reason label (graph_misses/not_captured).
                counter, _, reason = key.partition("/")
                name = _metric_name(counter)
                family = families.get(name)
                if family is None:
                    family = _backend_family(counter, name, ["model", "reason"] if reason else ["model"])
                    families[name] = family
                family.add_metric([model.card.name, reason] if reason else [model.card.name], float(value))
        return families.values()
