"""A bounded queue that turns concurrent requests into batches for a backend's worker threads.

The collect loop takes what is waiting (up to `max_batch`), lingers briefly for
requests already on their way (see `_next_batch`), hands the batch to a worker thread and
resolves one future per job. While the workers run, new jobs pile up and form
the next batch, so throughput grows with load while a lone job starts at once. A
backend that reads several batches at once (`allow`: the in-process engine
merges their reads in one loop's passes) gets the next batch as soon as one of
its slots is free, instead of after the batch before it, while the cost of
every batch it holds stays within one batch's budget (`max_batch_tokens`,
`max_batch_pixels`; `batch_budget.py`): closed-loop clients come back one by
one and form small batches, and a slot count alone would make the last of
them wait a pass behind the rest; a cost bound instead keeps what the
backend holds, and so what admission cannot see, to one batch's worth.
Jobs whose caller has gone (deadline, disconnect: a cancelled future) are
dropped before they run; one whose caller leaves while its batch runs still
counts as pending until the batch ends, because the worker is still busy with
it, and the batch function is told (its `gone` argument) so it can stop that
job's work at its next step. When a batch raises, each of its jobs is run again alone, so one
poisonous request cannot fail the requests that shared its batch. Admission
(`canvasread.admission`) sheds a request whose wait behind the work in flight
would pass `max_queue_delay_s`, before it is prepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from canvasread.admission import MAX_RETRY_S, Backlog
from canvasread.backends.base import MAX_BATCHES_AT_ONCE
from canvasread.batch_budget import BatchBudget
from canvasread.errors import BackendFailure, CanvasreadError, NotReady, Overloaded
from canvasread.types import JobCost

logger = logging.getLogger(__name__)
JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")
# A batch function: the jobs, and `gone(i)` (has job i's caller left?); one result per job, None only if gone.
RunBatch = Callable[[Sequence[JobT], Callable[[int], bool]], Sequence[ResultT | None]]


@dataclass(frozen=True)
class BatchSettings:
    """How jobs are grouped, set when starting the server (the first four are `canvasread serve` flags)."""

    max_batch: int = 32
    max_wait_s: float = 0.0
    max_pending: int = 1024
    # How long a batch may wait for requests that are already accepted but still being prepared.
    linger_s: float = 0.003
    # Peak memory grows with what one batch reads, whatever the mix: a batch takes jobs while their summed cost
    # stays within these (a job over them alone runs alone). 32,768 tokens is two 16k-token states (about 5 GB
    # of activations on the CPU engine); 100 M pixels is two 7000x7000 photos decoded at once.
    max_batch_tokens: int = 32_768
    max_batch_pixels: int = 100_000_000
    # The latency budget: a request that would wait longer than this behind the cost in flight, at the rate the
    # backend has served cost while busy, is answered 529 at once (`canvasread.admission`); None: never.
    max_queue_delay_s: float | None = 2.0

    def __post_init__(self) -> None:
        if min(self.max_batch, self.max_pending, self.max_batch_tokens, self.max_batch_pixels) < 1:
            raise ValueError("max_batch, max_pending, max_batch_tokens and max_batch_pixels must be at least 1")
        if self.max_wait_s < 0 or self.linger_s < 0 or (self.max_queue_delay_s or 0) < 0:
            raise ValueError("max_wait_s, linger_s and max_queue_delay_s cannot be negative")

    @property
    def limit(self) -> JobCost:
        """One batch's budget."""
        return JobCost(self.max_batch_tokens, self.max_batch_pixels)


# A 529's retry hint while the backlog's rate is not measured yet.
UNMEASURED_RETRY_S = 1.0


@dataclass
class BatchStats:
    """Counters the metrics layer reads; written only by the collect loop."""

    batches: int = 0
    jobs: int = 0
    dropped: int = 0
    shed: int = 0
    busy_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class _Pending(Generic[JobT, ResultT]):
    """A queued job and its cost units. While `running`, its place in line is held even if its caller has gone
    (`abandoned`): a worker is still spending time on it, so `max_pending`, the backlog and the drain on shutdown
    must still count it."""

    job: JobT
    future: asyncio.Future[ResultT]
    holds: JobCost  # what it makes the backend hold while it runs (the batch budget's units)
    running: bool = False
    abandoned: bool = False

    @property
    def cost(self) -> float:
        """Its cost units for the backlog: its tokens where the backend prices jobs (at least one), else one."""
        return float(max(1, self.holds.tokens))


class BatchQueue(Generic[JobT, ResultT]):
    """Feeds `run_batch` (which must return one result per job, in order) from many coroutines."""

    def __init__(
        self,
        run_batch: RunBatch[JobT, ResultT],
        settings: BatchSettings = BatchSettings(),
        *,
        name: str = "backend",
        cost: Callable[[JobT], JobCost] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._cost = cost
        self._held: _Pending[JobT, ResultT] | None = None  # took no place in the last batch: it starts the next
        self.settings = settings
        self.name = name
        self.stats = BatchStats()
        self.backlog = Backlog()
        self.batches_at_once = 1
        self.budgets_at_once = 1
        self._queue: asyncio.Queue[_Pending[JobT, ResultT]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=MAX_BATCHES_AT_ONCE, thread_name_prefix=f"canvasread-{name}")
        self._pending = 0
        self._running_jobs = 0  # jobs inside running batches
        self._holding = JobCost()  # what the running batches' jobs make the backend hold, summed
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Jobs accepted and not yet answered (queued or running)."""
        return self._pending

    def allow(self, batches: int, budgets: int = 1) -> None:
        """Let the backend read up to `batches` batches at once (1: one after another), holding up to `budgets`
        batches' budgets together (one per replica); any thread may call it (the model loads on one), and the
        collect loop heeds it when it next forms a batch."""
        self.batches_at_once = max(1, min(batches, MAX_BATCHES_AT_ONCE))
        self.budgets_at_once = max(1, budgets)

    def start(self) -> None:
        """Start the collect loop; the queue and the events belong to the running event loop."""
        self._queue = asyncio.Queue()
        self._idle = asyncio.Event()
        self._idle.set()
        self._slot_free = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._collect(), name=f"batch-{self.name}")

    async def stop(self, drain_s: float = 0.0) -> None:
        """Let the jobs in flight finish (waiting at most `drain_s`), then stop the loop and free the workers.

        Jobs still queued after the drain are failed with `NotReady`, so no caller waits forever.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_s)
        for task in [self._task, *self._running]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._held is not None:
            self._fail([self._held], NotReady(f"{self.name} is shutting down"))
            self._held = None
        while self._queue is not None and not self._queue.empty():
            self._fail([self._queue.get_nowait()], NotReady(f"{self.name} is shutting down"))
        # A batch still running past the drain cannot be interrupted; waiting for it here would hold the process
        # past --shutdown-timeout. Its thread is left to the process exit.
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, prepare: Callable[[], Awaitable[JobT]]) -> ResultT:
        """Take a place in line, prepare the job, queue it and wait for its result.

        Raises `Overloaded` when `max_pending` requests are already in flight, or
        when the work ahead would keep this one waiting past `max_queue_delay_s`.
        The place is taken before `prepare` runs, so an overloaded backend sheds a
        request before spending any work on it. Cancelling the caller (a deadline,
        a client that hung up) cancels the job's future and the collect loop skips it.
        """
        if self._queue is None:
            raise RuntimeError("BatchQueue.start() was not called")
        self._admit()
        self._pending += 1
        self._idle.clear()
        self.backlog.busy(time.monotonic())
        item: _Pending[JobT, ResultT] | None = None
        try:
            job = await prepare()
            holds = self._cost(job) if self._cost is not None else JobCost()
            item = _Pending(job, asyncio.get_running_loop().create_future(), holds)
            self.backlog.add(item.cost)
            self._queue.put_nowait(item)
            return await item.future
        finally:
            if item is not None and item.running:
                item.abandoned = True  # the batch still runs it: `_run` gives the place back when it ends
            else:
                self._release(item)

    def _admit(self) -> None:
        """Shed a request before it takes a place: the queue is full, or the wait is past the latency budget."""
        preparing = self._pending - self.backlog.prepared
        wait = self.backlog.wait_s(preparing)
        now = time.monotonic()
        if self._pending >= self.settings.max_pending:
            self.stats.shed += 1
            over = wait if wait is not None else UNMEASURED_RETRY_S
            raise Overloaded(
                f"{self.name} has {self._pending} requests in flight "
                f"(limit {self.settings.max_pending}, --max-pending)",
                retry_after_s=_hint(self.backlog.retry_after(over, now)),
            )
        budget = self.settings.max_queue_delay_s
        if wait is not None and budget is not None and wait > budget and not self._starts_now(preparing):
            self.stats.shed += 1
            raise Overloaded(
                f"{self.name} would keep this request waiting about {wait:.1f} s behind {self._pending} others "
                f"(limit {budget:g} s, --max-queue-delay)",
                retry_after_s=_hint(self.backlog.retry_after(wait - budget, now)),
            )

    def _starts_now(self, preparing: int) -> bool:
        """Whether a request admitted now would start at once: the backend has a batch free, the requests ahead
        of it that are not running yet (queued, or `preparing`) go in that batch with it, and all of it, the
        running batches included, is within one batch's token budget. Then it waits behind nothing (the backend
        shares its passes with the batches in flight), however long the work in flight takes: a thought of
        seconds must not make the next thought, which would share its passes, look as if it queued behind it;
        nor must clients that arrive together shed each other. Past one batch's budget the backend's passes are
        full, and the work in flight is a real wait."""
        waiting = self._pending - self._running_jobs
        fits = self.backlog.cost_ahead(preparing + 1) <= self.settings.max_batch_tokens * self.budgets_at_once
        return len(self._running) < self.batches_at_once and waiting < self.settings.max_batch and fits

    def _release(self, item: _Pending[JobT, ResultT] | None) -> None:
        if item is not None:
            self.backlog.remove(item.cost)
        self._pending -= 1
        if not self._pending:
            self._idle.set()
            self.backlog.idle()

    async def _next_batch(self, queue: asyncio.Queue[_Pending[JobT, ResultT]]) -> list[_Pending[JobT, ResultT]] | None:
        """Everything waiting, plus stragglers: for `max_wait_s`, and for `linger_s` more while requests that
        were accepted are still being prepared (closed-loop clients that just got an answer send their next
        request a moment later; without this they would fall out of step and be read one at a time).
        A lone request never waits: nothing else is in flight. None when the first job waiting does not fit
        beside what the running batches hold (it is kept for the next batch)."""
        held, self._held = self._held, None
        first = held if held is not None else await queue.get()
        budget = BatchBudget(self.settings.limit, self._holding if self._running else None, self.budgets_at_once)
        if not budget.fits(first.holds):
            self._held = first
            return None
        batch = [first]
        started = time.monotonic()
        while len(batch) < self.settings.max_batch:
            if not queue.empty():
                item = queue.get_nowait()
                if not budget.fits(item.holds):
                    self._held = item
                    break
                batch.append(item)
                continue
            waited = time.monotonic() - started
            remaining = self.settings.max_wait_s - waited
            if self._pending > self.backlog.prepared:  # accepted, still being prepared
                remaining = max(remaining, self.settings.linger_s - waited)
            if remaining <= 0:
                break
            try:
                item = await asyncio.wait_for(queue.get(), remaining)
            except TimeoutError:
                break
            if not budget.fits(item.holds):
                self._held = item
                break
            batch.append(item)
        return batch

    async def _collect(self) -> None:
        """Form a batch whenever the backend has a free slot and room beside what it holds, and run it beside the
        batches already running."""
        assert self._queue is not None
        while True:
            while len(self._running) >= self.batches_at_once:
                await self._a_batch_ends()
            batch = await self._next_batch(self._queue)
            if batch is None:  # its first job waits for room beside the running batches
                await self._a_batch_ends()
                continue
            live = self._live(batch)
            if live:
                self._started_running(live)
                task = asyncio.get_running_loop().create_task(self._run(live))
                self._running.add(task)
                task.add_done_callback(self._batch_done)

    async def _a_batch_ends(self) -> None:
        self._slot_free.clear()
        await self._slot_free.wait()

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slot_free.set()

    def _live(self, items: Sequence[_Pending[JobT, ResultT]]) -> list[_Pending[JobT, ResultT]]:
        """The items whose caller still waits; the rest are counted as dropped and never run."""
        live = [item for item in items if not item.future.done()]
        self.stats.dropped += len(items) - len(live)
        return live

    def _started_running(self, items: Sequence[_Pending[JobT, ResultT]]) -> None:
        """A worker takes these jobs (before their batch is handed over, so the next batch formed counts them)."""
        self._running_jobs += len(items)
        for item in items:
            item.running = True
            self._holding = self._holding.plus(item.holds)

    async def _run(self, live: list[_Pending[JobT, ResultT]]) -> None:
        """Run a batch whose jobs `_started_running` marked; resolve each job's future."""
        started = time.monotonic()
        try:
            try:
                results = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._run_batch, [i.job for i in live], lambda index: live[index].abandoned
                )
            finally:
                self._stopped_running(live)
            if len(results) != len(live):
                raise BackendFailure(f"{self.name} returned {len(results)} results for {len(live)} jobs")
        except asyncio.CancelledError:
            self._fail(live, NotReady(f"{self.name} stopped while answering"))
            raise
        except Exception as error:  # a model bug must fail the requests it touched, never the server
            self._record(live, time.monotonic() - started)
            if len(live) > 1:
                for item in live:  # find the poisonous job(s): the others still get their answers
                    if alone := self._live([item]):
                        self._started_running(alone)
                        await self._run(alone)
                return
            if not isinstance(error, CanvasreadError):
                logger.error("%s failed on a request", self.name, exc_info=error)
                error = BackendFailure(
                    f"{self.name} failed while answering ({type(error).__name__}); the server log has the details"
                )
            self._fail(live, error)
        else:
            self._record(live, time.monotonic() - started)
            for item, result in zip(live, results, strict=True):
                if item.future.done():
                    continue
                if result is None:
                    item.future.set_exception(BackendFailure(f"{self.name} left off a request whose caller waits"))
                else:
                    item.future.set_result(result)

    def _stopped_running(self, items: Sequence[_Pending[JobT, ResultT]]) -> None:
        """The worker is done with these jobs: give back the places of callers that left while they ran."""
        self._running_jobs -= len(items)
        for item in items:
            item.running = False
            self._holding = self._holding.minus(item.holds)
            if item.abandoned:
                item.abandoned = False
                self._release(item)

    def _record(self, items: Sequence[_Pending[JobT, ResultT]], seconds: float) -> None:
        self.stats.batches += 1
        self.stats.jobs += len(items)
        self.stats.busy_s += seconds
        self.stats.batch_sizes.append(len(items))
        del self.stats.batch_sizes[:-1024]
        self.backlog.served(sum(item.cost for item in items), len(items), time.monotonic())

    @staticmethod
    def _fail(items: Sequence[_Pending[JobT, ResultT]], error: Exception) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)


def _hint(seconds: float) -> float:
    """A 529's Retry-After: the wait, kept between 50 ms and MAX_RETRY_S."""
    return min(MAX_RETRY_S, max(0.05, seconds))
