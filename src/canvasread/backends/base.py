"""The `Backend` protocol: the one seam between serving and models.

A backend answers batches of validated requests with probability
distributions. It never sees HTTP and never builds wire answers; the
`Decider` does order rotations, calibration and answer assembly around it.

Contract:
- `load()` may be slow (weights, compilation); it runs once, in a worker
  thread, while the server already answers `/health`.
- `prepare(request)` runs on the request's own path before queueing, on a
  thread of the model's bounded prepare pool (`canvasread.preparing`): it
  checks everything that can be checked without the model (labels, context
  length...) and raises `InvalidRequest` with a precise location, so a bad
  request never reaches a batch. It returns the backend's own job object. A
  backend whose preparation takes many steps (texts to tokenise) calls
  `stop_if_left()` between them, so it ends once the caller has gone.
- `decide(jobs, gone)` runs one batch in the backend's single worker thread and
  returns one `DecisionResult` per job, in order. An exception fails only the
  jobs of that batch. `gone(i)` turns true once job i's caller has left while
  the batch runs (its deadline passed, it hung up): a backend whose batch
  takes several steps (questions one by one, re-reads) checks it between
  steps and leaves such a job off, returning None in its place, so work nobody
  waits for stops early. None is allowed only where `gone(i)` said so.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from canvasread.types import (
    Capabilities,
    DecisionRequest,
    DecisionResult,
    Distribution,
    JobCost,
    ModelCard,
    Usage,
)

JobT = TypeVar("JobT")
# The `gone` of `Backend.decide`: job index -> whether its caller has left.
Gone = Callable[[int], bool]


def never_gone(index: int) -> bool:
    """The callers of a synchronous call (the library, evaluation) wait for every job."""
    return False


T = TypeVar("T")
# Set around each preparation the prepare pool runs: set once that request's caller has gone.
_caller_left: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("caller_left", default=None)


class PreparationStopped(Exception):
    """Raised by `stop_if_left` in a preparation whose caller has gone; nobody waits for its result."""


def stop_if_left() -> None:
    """Between the steps of a `prepare`: raises `PreparationStopped` once its caller has gone (a no-op outside
    the prepare pool, where the caller always waits)."""
    left = _caller_left.get()
    if left is not None and left.is_set():
        raise PreparationStopped("the caller has gone")


def watching(left: threading.Event, work: Callable[[], T]) -> T:
    """`work()`, with `stop_if_left` inside it watching `left` (the prepare pool runs every preparation so)."""
    context = contextvars.copy_context()
    context.run(_caller_left.set, left)
    return context.run(work)


class Backend(Protocol[JobT]):
    """See the module docstring for the contract."""

    @property
    def card(self) -> ModelCard: ...

    def load(self) -> None: ...

    def prepare(self, request: DecisionRequest) -> JobT: ...

    def decide(self, jobs: Sequence[JobT], gone: Gone = never_gone) -> list[DecisionResult | None]: ...


AnyBackend = Backend[Any]


# Keys of `ReportsCounters.counters()` that are levels at this moment, not totals (exported as gauges).
LEVELS = frozenset({"kv_cache_entries", "kv_store_free_pages"})


@runtime_checkable
class ReportsCounters(Protocol):
    """Optional: a backend that counts its own work (reads, re-reads, prefix-cache hits...) for `/metrics`.

    Values are monotonic totals since load, keyed by a short snake_case name, except the keys in `LEVELS`.
    """

    def counters(self) -> Mapping[str, float]: ...


@runtime_checkable
class ReportsCost(Protocol):
    """Optional: what a prepared job makes the model hold at once (tokens in one pass, pixels decoded).

    The batch queue forms batches under `BatchSettings.max_batch_tokens`/`max_batch_pixels` from it, so
    peak memory is bounded whatever the mix of requests. Called on the event loop: keep it arithmetic.
    """

    def cost(self, job: Any) -> JobCost: ...


# The most batches any backend may read at once (the batch queue's worker threads, started as they are needed).
MAX_BATCHES_AT_ONCE = 64


@runtime_checkable
class ReadsBatchesAtOnce(Protocol):
    """Optional: a backend whose `decide` may run for several batches at once, each on a worker thread of its own
    (the in-process engine merges their reads, re-reads and thoughts in one loop's passes, so a batch's re-read
    round rides beside the next batch's first reads). Read once the backend has loaded; 1 means one at a time.
    `budgets_at_once` is how many batches' budgets (`max_batch_tokens`, `max_batch_pixels`) the batches in flight
    may hold together: one per replica, since each holds its share of every batch.
    """

    @property
    def batches_at_once(self) -> int: ...

    @property
    def budgets_at_once(self) -> int: ...


@runtime_checkable
class HasFingerprint(Protocol):
    """Optional: a stable hash of everything that shapes the backend's probabilities (weights, config).

    A calibration file records it and is refused by a backend whose fingerprint
    differs. None means not known yet (before `load()`); the check then runs
    right after loading. Keep it cheap: hash a weights index and config, not
    tens of GB of weights. Format: `"sha256:<hex>"`.
    """

    @property
    def fingerprint(self) -> str | None: ...


@runtime_checkable
class ReportsHealth(Protocol):
    """Optional: a backend that can tell it has died (device lost, upstream gone) and when it is back.

    `health_problem()` returns None while the backend can answer, else a short
    reason; meanwhile `/ready` answers 503 with the reason and requests to the
    model get 503 (clients retry it) instead of failing one by one. It is called
    on every `/ready` probe and request, on the event loop: keep it cheap and
    never block (return a flag that the worker thread sets).
    """

    def health_problem(self) -> str | None: ...


class FunctionBackend:
    """A backend made from a function of one request: the test seam for everything above backends."""

    def __init__(
        self,
        answer: Callable[[DecisionRequest], Sequence[Sequence[float]]],
        *,
        name: str = "function",
        capabilities: Capabilities = Capabilities(),
    ) -> None:
        self._answer = answer
        self._card = ModelCard(name, "A backend driven by a Python function.", "2026-01-01", capabilities)
        self.batches: list[int] = []

    @property
    def card(self) -> ModelCard:
        return self._card

    def load(self) -> None:
        return None

    def prepare(self, request: DecisionRequest) -> DecisionRequest:
        return request

    def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
        self.batches.append(len(jobs))
        results: list[DecisionResult | None] = []
        for index, request in enumerate(jobs):
            if gone(index):
                results.append(None)
                continue
            distributions = tuple(Distribution(tuple(p)) for p in self._answer(request))
            results.append(DecisionResult(distributions, Usage(1, len(distributions))))
        return results
