"""A bounded queue that turns concurrent requests into batches for one backend worker.

The collect loop takes what is waiting (up to `max_batch`), lingers briefly for
requests already on their way (see `_next_batch`), hands the batch to a single worker thread and
resolves one future per job. While the worker runs, new jobs pile up and form
the next batch, so throughput grows with load while a lone job starts at once.
Jobs whose caller has gone (deadline, disconnect: a cancelled future) are
dropped before they run. When a batch raises, each of its jobs is run again
alone, so one poisonous request cannot fail the requests that shared its batch.
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

from canvasread.errors import BackendFailure, CanvasreadError, NotReady, Overloaded

logger = logging.getLogger(__name__)
JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class BatchSettings:
    """How jobs are grouped; every number is a knob on `canvasread serve`."""

    max_batch: int = 32
    max_wait_s: float = 0.0
    max_pending: int = 1024
    # How long a batch may wait for requests that are already accepted but still being prepared.
    linger_s: float = 0.003


@dataclass
class BatchStats:
    """Counters the metrics layer reads; written only by the collect loop."""

    batches: int = 0
    jobs: int = 0
    dropped: int = 0
    busy_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class _Pending(Generic[JobT, ResultT]):
    job: JobT
    future: asyncio.Future[ResultT]


class BatchQueue(Generic[JobT, ResultT]):
    """Feeds `run_batch` (which must return one result per job, in order) from many coroutines."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[JobT]], list[ResultT]],
        settings: BatchSettings = BatchSettings(),
        *,
        name: str = "backend",
    ) -> None:
        self._run_batch = run_batch
        self.settings = settings
        self.name = name
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending[JobT, ResultT]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"canvasread-{name}")
        self._pending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Jobs accepted and not yet answered (queued or running)."""
        return self._pending

    def start(self) -> None:
        """Start the collect loop; the queue and the idle flag belong to the running event loop."""
        self._queue = asyncio.Queue()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = asyncio.get_running_loop().create_task(self._collect(), name=f"batch-{self.name}")

    async def stop(self, drain_s: float = 0.0) -> None:
        """Let the jobs in flight finish (waiting at most `drain_s`), then stop the loop and free the worker.

        Jobs still queued after the drain are failed with `NotReady`, so no caller waits forever.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue is not None and not self._queue.empty():
            self._fail([self._queue.get_nowait()], NotReady(f"{self.name} is shutting down"))
        # A batch still running past the drain cannot be interrupted; waiting for it here would hold the process
        # past --shutdown-timeout. Its thread is left to the process exit.
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, prepare: Callable[[], Awaitable[JobT]]) -> ResultT:
        """Take a place in line, prepare the job, queue it and wait for its result.

        Raises `Overloaded` when `max_pending` requests are already in flight. The
        place is taken before `prepare` runs, so an overloaded backend sheds a
        request before spending any work on it. Cancelling the caller (a deadline,
        a client that hung up) cancels the job's future and the collect loop skips it.
        """
        if self._queue is None:
            raise RuntimeError("BatchQueue.start() was not called")
        if self._pending >= self.settings.max_pending:
            raise Overloaded(
                f"{self.name} has {self._pending} requests in flight (limit {self.settings.max_pending})",
                retry_after_s=self._retry_hint_s(),
            )
        self._pending += 1
        self._idle.clear()
        try:
            job = await prepare()
            future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
            self._queue.put_nowait(_Pending(job, future))
            return await future
        finally:
            self._pending -= 1
            if not self._pending:
                self._idle.set()

    def _retry_hint_s(self) -> float:
        """Roughly how long the backlog takes to clear, from the measured time per batch."""
        per_batch = self.stats.busy_s / self.stats.batches if self.stats.batches else 0.05
        batches_ahead = self._pending / max(1, self.settings.max_batch)
        return min(30.0, max(0.05, per_batch * batches_ahead))

    async def _next_batch(self, queue: asyncio.Queue[_Pending[JobT, ResultT]]) -> list[_Pending[JobT, ResultT]]:
        """Everything waiting, plus stragglers: for `max_wait_s`, and for `linger_s` more while requests that
        were accepted are still being prepared (closed-loop clients that just got an answer send their next
        request a moment later; without this they would fall out of step and be read one at a time).
        A lone request never waits: nothing else is in flight."""
        batch = [await queue.get()]
        started = time.monotonic()
        while len(batch) < self.settings.max_batch:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            waited = time.monotonic() - started
            remaining = self.settings.max_wait_s - waited
            if self._pending > len(batch):
                remaining = max(remaining, self.settings.linger_s - waited)
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _collect(self) -> None:
        assert self._queue is not None
        while True:
            batch = await self._next_batch(self._queue)
            live = self._live(batch)
            if live:
                await self._run(live)

    def _live(self, items: Sequence[_Pending[JobT, ResultT]]) -> list[_Pending[JobT, ResultT]]:
        """The items whose caller still waits; the rest are counted as dropped and never run."""
        live = [item for item in items if not item.future.done()]
        self.stats.dropped += len(items) - len(live)
        return live

    async def _run(self, live: list[_Pending[JobT, ResultT]]) -> None:
        started = time.monotonic()
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run_batch, [i.job for i in live]
            )
            if len(results) != len(live):
                raise BackendFailure(f"{self.name} returned {len(results)} results for {len(live)} jobs")
        except asyncio.CancelledError:
            self._fail(live, NotReady(f"{self.name} stopped while answering"))
            raise
        except Exception as error:  # a model bug must fail the requests it touched, never the server
            self._record(len(live), time.monotonic() - started)
            if len(live) > 1:
                for item in live:  # find the poisonous job(s): the others still get their answers
                    if alone := self._live([item]):
                        await self._run(alone)
                return
            if not isinstance(error, CanvasreadError):
                logger.error("%s failed on a request", self.name, exc_info=error)
                error = BackendFailure(
                    f"{self.name} failed while answering ({type(error).__name__}); the server log has the details"
                )
            self._fail(live, error)
        else:
            self._record(len(live), time.monotonic() - started)
            for item, result in zip(live, results, strict=True):
                if not item.future.done():
                    item.future.set_result(result)

    def _record(self, size: int, seconds: float) -> None:
        self.stats.batches += 1
        self.stats.jobs += size
        self.stats.busy_s += seconds
        self.stats.batch_sizes.append(size)
        del self.stats.batch_sizes[:-1024]

    @staticmethod
    def _fail(items: Sequence[_Pending[JobT, ResultT]], error: Exception) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
