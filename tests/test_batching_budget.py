"""`BatchQueue` under a token and pixel budget: what one batch takes, and what the batches running at once hold
together (issue 16, item 10; the cost bound on batches in flight). Driven by gates and events, not sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest
from helpers import Gate, ready, until
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasread.backends.base import never_gone
from canvasread.batching import BatchQueue, BatchSettings
from canvasread.errors import Overloaded
from canvasread.types import JobCost


def sized(job: str) -> JobCost:
    """Jobs named "name:tokens:pixels"."""
    _, tokens, pixels = job.split(":")
    return JobCost(int(tokens), int(pixels))


def batches_of(jobs: Sequence[str], settings: BatchSettings) -> list[list[str]]:
    """The batches `jobs` form when all are waiting as the worker frees up (a held first job keeps the rest queued)."""

    async def scenario() -> list[list[str]]:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, settings, cost=sized)
        queue.start()
        first = asyncio.create_task(queue.submit(ready("first:0:0")))
        await until(gate.entered.is_set)
        rest = [asyncio.create_task(queue.submit(ready(job))) for job in jobs]
        await until(lambda: queue.pending == len(jobs) + 1)
        gate.release.set()
        assert await asyncio.gather(first, *rest) == [job.upper() for job in ("first:0:0", *jobs)]
        await queue.stop()
        return gate.batches[1:]

    return asyncio.run(scenario())


def test_a_batch_takes_jobs_while_their_tokens_fit_and_the_next_one_starts_the_next_batch() -> None:
    settings = BatchSettings(max_batch_tokens=100)
    jobs = ["a:40:0", "b:50:0", "c:20:0", "d:90:0", "e:10:0"]
    assert batches_of(jobs, settings) == [["a:40:0", "b:50:0"], ["c:20:0"], ["d:90:0", "e:10:0"]]


def test_a_job_over_the_budget_alone_runs_alone_and_pixels_count_too() -> None:
    settings = BatchSettings(max_batch_tokens=100, max_batch_pixels=1_000)
    jobs = ["a:10:0", "huge:500:0", "b:10:600", "c:10:600", "d:10:0"]
    assert batches_of(jobs, settings) == [["a:10:0"], ["huge:500:0"], ["b:10:600"], ["c:10:600", "d:10:0"]]


def test_without_a_cost_function_only_max_batch_limits_a_batch() -> None:
    async def scenario() -> list[list[str]]:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_batch=2, max_batch_tokens=1))
        queue.start()
        first = asyncio.create_task(queue.submit(ready("first")))
        await until(gate.entered.is_set)
        rest = [asyncio.create_task(queue.submit(ready(job))) for job in "abc"]
        await until(lambda: queue.pending == 4)
        gate.release.set()
        await asyncio.gather(first, *rest)
        await queue.stop()
        return gate.batches

    assert asyncio.run(scenario()) == [["first"], ["a", "b"], ["c"]]


class Stalls:
    """A batch function whose batches each wait for their own release (by the first job's name), recording what
    entered and what left, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.release = {name: threading.Event() for name in "abcd"}

    def __call__(self, jobs: Sequence[str], gone: Callable[[int], bool] = never_gone) -> list[str]:
        name = jobs[0][0]
        self.events.append(f"enter {name}")
        assert self.release[name].wait(30), "the batch was never released"
        self.events.append(f"leave {name}")
        return [job.upper() for job in jobs]


def four_at_once(stalls: Stalls, settings: BatchSettings, budgets: int = 1) -> BatchQueue[str, str]:
    """A started queue over `stalls` for jobs priced by `sized`, four batches at once."""
    queue: BatchQueue[str, str] = BatchQueue(stalls, settings, cost=sized)
    queue.allow(4, budgets)
    queue.start()
    return queue


def test_beside_running_batches_a_batch_takes_only_what_fits_the_budget_with_them() -> None:
    """Four batches at once and a budget of 100 tokens: "b" (30) runs beside "a" (60), "c" (20) would pass the
    budget with them and waits, slots free or not, until a batch ends and leaves it room."""

    async def scenario() -> None:
        stalls = Stalls()
        queue = four_at_once(stalls, BatchSettings(max_batch_tokens=100, linger_s=0.0))
        a = asyncio.create_task(queue.submit(ready("a:60:0")))
        await until(lambda: stalls.events == ["enter a"])
        b = asyncio.create_task(queue.submit(ready("b:30:0")))
        await until(lambda: stalls.events == ["enter a", "enter b"])
        c = asyncio.create_task(queue.submit(ready("c:20:0")))
        await until(lambda: queue.pending == 3)
        for _ in range(20):  # the collect loop's turns: it would hand "c" over now if it fit
            await asyncio.sleep(0)
        assert stalls.events == ["enter a", "enter b"]
        stalls.release["b"].set()
        await until(lambda: "enter c" in stalls.events)
        assert stalls.events == ["enter a", "enter b", "leave b", "enter c"]
        stalls.release["a"].set()
        stalls.release["c"].set()
        assert await asyncio.gather(a, b, c) == ["A:60:0", "B:30:0", "C:20:0"]
        await queue.stop()

    asyncio.run(scenario())


def test_a_backend_of_several_replicas_holds_a_budget_for_each_in_flight() -> None:
    """Two budgets (two replicas, each holding its share of every batch): "b" (60) runs beside "a" (60), where one
    budget of 100 would have made it wait."""

    async def scenario() -> None:
        stalls = Stalls()
        queue = four_at_once(stalls, BatchSettings(max_batch_tokens=100, linger_s=0.0), budgets=2)
        a = asyncio.create_task(queue.submit(ready("a:60:0")))
        await until(lambda: stalls.events == ["enter a"])
        b = asyncio.create_task(queue.submit(ready("b:60:0")))
        await until(lambda: stalls.events == ["enter a", "enter b"])
        stalls.release["a"].set()
        stalls.release["b"].set()
        assert await asyncio.gather(a, b) == ["A:60:0", "B:60:0"]
        await queue.stop()

    asyncio.run(scenario())


def test_a_free_slot_admits_past_the_queue_delay_only_while_the_work_in_flight_fits_one_batch() -> None:
    """A measured rate that makes the work in flight a wait far past the 1.5 s budget: beside "a" (90 of a
    100-token budget), the next request is admitted (with its estimated cost it fits one batch with "a", so it
    would share a's passes); once "b" (20) has come, the work in flight is past one batch, and the request after
    it is shed though batches are free: the backend's passes are full, and the wait is real."""

    async def scenario() -> None:
        stalls = Stalls()
        queue = four_at_once(stalls, BatchSettings(max_batch_tokens=100, max_queue_delay_s=1.5))
        queue.backlog.recent.extend([(1.0, 1, 10.0)] * 4)
        a = asyncio.create_task(queue.submit(ready("a:90:0")))
        await until(lambda: stalls.events == ["enter a"])
        b = asyncio.create_task(queue.submit(ready("b:20:0")))
        await until(lambda: queue.pending == 2 and queue.backlog.prepared == 2)
        with pytest.raises(Overloaded, match="--max-queue-delay"):
            await queue.submit(ready("c:1:0"))
        stalls.release["a"].set()
        stalls.release["b"].set()
        assert await asyncio.gather(a, b) == ["A:90:0", "B:20:0"]
        await queue.stop()

    asyncio.run(scenario())


class Overlaps:
    """A batch function that keeps what the batches running at once hold together, at its largest, and every
    batch it was handed: each batch holds its place for a moment so that batches overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: list[list[str]] = []
        self.batches: list[list[str]] = []
        self.crowded: list[list[list[str]]] = []  # the batches running at once whenever more than one ran

    def __call__(self, jobs: Sequence[str], gone: Callable[[int], bool] = never_gone) -> list[str]:
        batch = list(jobs)
        with self.lock:
            self.running.append(batch)
            self.batches.append(batch)
            if len(self.running) > 1:
                self.crowded.append([list(b) for b in self.running])
        threading.Event().wait(0.002)  # hold the batch's place for a moment, so the next ones run beside it
        with self.lock:
            self.running.remove(batch)
        return [job.upper() for job in jobs]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=150), min_size=1, max_size=40))
def test_the_batches_running_at_once_never_hold_more_than_the_budget_and_every_job_is_answered(
    tokens: list[int],
) -> None:
    """Jobs of any sizes (some alone over the 100-token budget), sent at once to a queue reading 8 batches at
    once: every job is answered, in its own batch once; batches overlap only while what they hold together
    fits the budget; a batch over it is a single job."""
    jobs = [f"j{n}:{size}:0" for n, size in enumerate(tokens)]

    async def scenario() -> list[str]:
        overlaps = Overlaps()
        queue: BatchQueue[str, str] = BatchQueue(overlaps, BatchSettings(max_batch_tokens=100), cost=sized)
        queue.allow(8)
        queue.start()
        answers = await asyncio.gather(*(queue.submit(ready(job)) for job in jobs))
        await queue.stop()
        for batch in overlaps.batches:
            assert len(batch) == 1 or sum(sized(job).tokens for job in batch) <= 100
        for running in overlaps.crowded:
            assert sum(sized(job).tokens for batch in running for job in batch) <= 100
        assert sorted(job for batch in overlaps.batches for job in batch) == sorted(jobs)
        return list(answers)

    assert asyncio.run(scenario()) == [job.upper() for job in jobs]
