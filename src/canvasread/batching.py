"""A bounded queue that turns concurrent requests into batches for one backend worker.

The collect loop takes what is waiting (up to `max_batch`), optionally lingers
`max_wait_s` for stragglers, hands the batch to a single worker thread and
resolves one future per job. While the worker runs, new jobs pile up and form
the next batch, so throughput grows with load while a lone job starts at once.
Jobs whose caller has gone (cancelled future) are dropped before they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from canvasread.errors import BackendFailure, CanvasreadError, Overloaded

JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class BatchPolicy:
    """How jobs are grouped; every number is a knob on `canvasread serve`."""

    max_batch: int = 32
    max_wait_s: float = 0.0
    max_pending: int = 1024


@dataclass
class BatchStats:
    """Counters the metrics layer reads; written only by the collect loop."""

    batches: int = 0
    jobs: int = 0
    dropped: int = 0
    last_batch_size: int = 0
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
        policy: BatchPolicy = BatchPolicy(),
        *,
        name: str = "backend",
    ) -> None:
        self._run_batch = run_batch
        self.policy = policy
        self.name = name
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending[JobT, ResultT]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"canvasread-{name}")
        self._pending = 0

    @property
    def pending(self) -> int:
        """Jobs accepted and not yet answered (queued or running)."""
        return self._pending

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._collect(), name=f"batch-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def submit(self, job: JobT) -> ResultT:
        """Queue one job and wait for its result; raises `Overloaded` when the queue is full."""
        if self._queue is None:
            raise RuntimeError("BatchQueue.start() was not called")
        if self._pending >= self.policy.max_pending:
            raise Overloaded(
                f"{self.name} has {self._pending} requests in flight (limit {self.policy.max_pending})",
                retry_after_s=self._retry_hint_s(),
            )
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._pending += 1
        try:
            self._queue.put_nowait(_Pending(job, future))
            return await future
        finally:
            self._pending -= 1

    def _retry_hint_s(self) -> float:
        """Roughly how long the backlog takes to clear, from the measured time per batch."""
        per_batch = self.stats.busy_s / self.stats.batches if self.stats.batches else 0.05
        batches_ahead = self._pending / max(1, self.policy.max_batch)
        return min(30.0, max(0.05, per_batch * batches_ahead))

    async def _next_batch(self, queue: asyncio.Queue[_Pending[JobT, ResultT]]) -> list[_Pending[JobT, ResultT]]:
        batch = [await queue.get()]
        deadline = time.monotonic() + self.policy.max_wait_s
        while len(batch) < self.policy.max_batch:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _collect(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch(self._queue)
            live = [item for item in batch if not item.future.done()]
            self.stats.dropped += len(batch) - len(live)
            if not live:
                continue
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, [i.job for i in live])
                if len(results) != len(live):
                    raise BackendFailure(f"{self.name} returned {len(results)} results for {len(live)} jobs")
            except CanvasreadError as error:
                self._fail(live, error)
            except Exception as error:  # a model bug must fail its batch, never the server
                self._fail(live, BackendFailure(f"{self.name} failed: {type(error).__name__}: {error}"))
            else:
                for item, result in zip(live, results, strict=True):
                    if not item.future.done():
                        item.future.set_result(result)
            finally:
                self._record(len(live), time.monotonic() - started)

    def _record(self, size: int, seconds: float) -> None:
        self.stats.batches += 1
        self.stats.jobs += size
        self.stats.last_batch_size = size
        self.stats.busy_s += seconds
        self.stats.batch_sizes.append(size)
        del self.stats.batch_sizes[:-1024]

    @staticmethod
    def _fail(items: Sequence[_Pending[JobT, ResultT]], error: Exception) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
