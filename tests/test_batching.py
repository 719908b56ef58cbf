"""`BatchQueue` on its own: batches form from what waits, stragglers being prepared are waited for, a lone job never is.

Driven by gates and events, not sleeps: each test says what must have
happened before the next step, so a loaded machine only makes it slower.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

import pytest
from helpers import Gate, ready, until

from canvasread.backends.base import never_gone
from canvasread.batching import BatchQueue, BatchSettings
from canvasread.errors import BackendFailure, Overloaded


def upper(jobs: Sequence[str], gone: Callable[[int], bool] = never_gone) -> list[str]:
    return [job.upper() for job in jobs]


def test_jobs_that_arrive_while_the_worker_runs_form_the_next_batch() -> None:
    async def scenario() -> list[str]:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate)
        queue.start()
        first = asyncio.create_task(queue.submit(ready("a")))
        await until(gate.entered.is_set)
        later = [asyncio.create_task(queue.submit(ready(job))) for job in ("b", "c")]
        await until(lambda: queue.pending == 3)
        gate.release.set()
        results = await asyncio.gather(first, *later)
        await queue.stop()
        assert gate.batches == [["a"], ["b", "c"]]
        return list(results)

    assert asyncio.run(scenario()) == ["A", "B", "C"]


def test_two_closed_loop_clients_share_batches() -> None:
    """Each client sends its next job as soon as it has an answer; lingering keeps the two in step."""
    batches: list[int] = []

    def run(jobs: Sequence[str], gone: Callable[[int], bool] = never_gone) -> list[str]:
        batches.append(len(jobs))
        return upper(jobs)

    async def client(queue: BatchQueue[str, str], name: str) -> None:
        for round_number in range(8):
            assert await queue.submit(ready(f"{name}{round_number}")) == f"{name}{round_number}".upper()

    async def scenario() -> None:
        queue: BatchQueue[str, str] = BatchQueue(run, BatchSettings(linger_s=5.0))
        queue.start()
        await asyncio.gather(client(queue, "x"), client(queue, "y"))
        await queue.stop()

    asyncio.run(scenario())
    assert sum(batches) == 16
    assert batches == [2] * 8  # without lingering: 1, 1, 1, ... (each waits a pass)


def test_a_batch_waits_for_a_job_still_being_prepared_and_no_longer() -> None:
    async def scenario() -> float:
        gate = Gate()
        gate.release.set()
        prepared = asyncio.Event()

        async def slow_prepare() -> str:
            await prepared.wait()
            return "late"

        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(linger_s=30.0))
        queue.start()
        started = time.monotonic()
        late = asyncio.create_task(queue.submit(slow_prepare))
        early = asyncio.create_task(queue.submit(ready("early")))
        await until(lambda: queue.pending == 2)
        await asyncio.sleep(0.05)
        assert not gate.entered.is_set()  # the early job lingers for the one in preparation
        prepared.set()
        assert await asyncio.gather(early, late) == ["EARLY", "LATE"]
        await queue.stop()
        assert gate.batches == [["early", "late"]]
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 30.0  # the linger ended when the straggler arrived, not at its bound


def test_a_lone_job_never_waits_for_company() -> None:
    async def scenario() -> float:
        queue: BatchQueue[str, str] = BatchQueue(upper, BatchSettings(linger_s=30.0))
        queue.start()
        started = time.monotonic()
        for job in ("a", "b", "c"):
            assert await queue.submit(ready(job)) == job.upper()
        elapsed = time.monotonic() - started
        await queue.stop()
        return elapsed

    assert asyncio.run(scenario()) < 30.0


def test_a_job_whose_caller_left_is_dropped_before_it_runs() -> None:
    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate)
        queue.start()
        running = asyncio.create_task(queue.submit(ready("running")))
        await until(gate.entered.is_set)
        abandoned = asyncio.create_task(queue.submit(ready("abandoned")))
        kept = asyncio.create_task(queue.submit(ready("kept")))
        await until(lambda: queue.pending == 3)
        abandoned.cancel()
        gate.release.set()
        assert await running == "RUNNING" and await kept == "KEPT"
        await queue.stop()
        assert gate.ran == ["running", "kept"]
        assert queue.stats.dropped == 1

    asyncio.run(scenario())


def test_a_job_whose_caller_left_while_it_runs_counts_as_pending_until_the_batch_ends() -> None:
    """A 504 or a hang-up frees nothing while the worker is still busy with the job (issue 16, item 6)."""

    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_pending=1))
        queue.start()
        running = asyncio.create_task(queue.submit(ready("running")))
        await until(gate.entered.is_set)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert queue.pending == 1
        with pytest.raises(Overloaded):  # the worker is still busy: the place is not free yet
            await queue.submit(ready("next"))
        gate.release.set()
        await until(lambda: queue.pending == 0)
        assert await queue.submit(ready("next")) == "NEXT"
        await queue.stop()

    asyncio.run(scenario())


def test_a_full_queue_sheds_before_preparing() -> None:
    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_pending=1))
        queue.start()
        first = asyncio.create_task(queue.submit(ready("first")))
        await until(gate.entered.is_set)
        prepared: list[str] = []

        async def counted() -> str:
            prepared.append("second")
            return "second"

        with pytest.raises(Overloaded) as caught:
            await queue.submit(counted)
        assert prepared == [] and caught.value.retry_after_s > 0
        gate.release.set()
        assert await first == "FIRST"
        await queue.stop()

    asyncio.run(scenario())


def test_a_request_that_would_start_at_once_is_admitted_whatever_the_work_in_flight() -> None:
    """Two batches at once, one running a job that the measured rate says takes 10 s (past the 1.5 s budget): the
    next job has a batch free and nothing ahead of it, so it starts beside the first; the one after that would
    wait for a batch, so it is shed."""

    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_queue_delay_s=1.5))
        queue.allow(2)
        queue.start()
        queue.backlog.recent.extend([(1.0, 1, 10.0)] * 4)
        first = asyncio.create_task(queue.submit(ready("a")))
        await until(gate.entered.is_set)
        second = asyncio.create_task(queue.submit(ready("b")))
        await until(lambda: len(gate.entered_jobs) == 2)
        with pytest.raises(Overloaded, match="--max-queue-delay"):
            await queue.submit(ready("c"))
        gate.release.set()
        assert await asyncio.gather(first, second) == ["A", "B"]
        await queue.stop()

    asyncio.run(scenario())


def test_requests_that_arrive_together_while_a_batch_is_free_start_together() -> None:
    """One batch at a time, and a measured rate that makes each job a 10 s wait (past the 1.5 s budget): three
    requests sent at once while no batch runs all go in the one batch; a fourth, once it runs, is shed."""

    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_queue_delay_s=1.5, linger_s=60.0))
        queue.start()
        queue.backlog.recent.extend([(1.0, 1, 10.0)] * 4)
        together = [asyncio.create_task(queue.submit(ready(job))) for job in ("a", "b", "c")]
        await until(gate.entered.is_set)
        assert gate.entered_jobs == ["a", "b", "c"]
        with pytest.raises(Overloaded, match="--max-queue-delay"):
            await queue.submit(ready("d"))
        gate.release.set()
        assert await asyncio.gather(*together) == ["A", "B", "C"]
        await queue.stop()

    asyncio.run(scenario())


def test_a_request_that_would_wait_past_the_queue_delay_is_shed_before_preparing() -> None:
    """At the measured rate (here set: one job a second), 2 jobs ahead is a 2 s wait: past 1.5 s, so shed, and told
    to come back once the wait is within the budget (0.5 s) and one mean job later (1 s)."""

    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_queue_delay_s=1.5))
        queue.start()
        queue.backlog.recent.extend([(1.0, 1, 1.0)] * 4)
        accepted = [asyncio.create_task(queue.submit(ready(job))) for job in ("a", "b")]
        await until(lambda: queue.pending == 2 and gate.entered.is_set())
        prepared: list[str] = []

        async def counted() -> str:
            prepared.append("c")
            return "c"

        with pytest.raises(Overloaded, match="--max-queue-delay") as caught:
            await queue.submit(counted)
        assert prepared == [] and caught.value.retry_after_s == pytest.approx(1.5)
        assert queue.stats.shed == 1
        gate.release.set()
        assert await asyncio.gather(*accepted) == ["A", "B"]
        await queue.stop()

    asyncio.run(scenario())


def test_the_queue_delay_sheds_nothing_until_the_rate_is_measured() -> None:
    async def scenario() -> None:
        gate = Gate()
        queue: BatchQueue[str, str] = BatchQueue(gate, BatchSettings(max_queue_delay_s=0.0))
        queue.start()
        jobs = [asyncio.create_task(queue.submit(ready(job))) for job in "abc"]
        await until(lambda: queue.pending == 3)
        gate.release.set()
        assert await asyncio.gather(*jobs) == ["A", "B", "C"]
        await queue.stop()

    asyncio.run(scenario())


def test_a_failing_batch_is_rerun_job_by_job_so_only_the_poisonous_job_fails() -> None:
    def run(jobs: Sequence[str], gone: Callable[[int], bool] = never_gone) -> list[str]:
        if "poison" in jobs:
            raise RuntimeError("model bug")
        return upper(jobs)

    async def scenario() -> list[object]:
        gate = Gate()
        gated: BatchQueue[str, str] = BatchQueue(lambda jobs, gone: gate(jobs) if jobs == ["hold"] else run(jobs))
        gated.start()
        hold = asyncio.create_task(gated.submit(ready("hold")))
        await until(gate.entered.is_set)
        jobs = [asyncio.create_task(gated.submit(ready(job))) for job in ("ok", "poison", "fine")]
        await until(lambda: gated.pending == 4)
        gate.release.set()
        results = await asyncio.gather(hold, *jobs, return_exceptions=True)
        await gated.stop()
        return list(results)

    hold, ok, poison, fine = asyncio.run(scenario())
    assert (hold, ok, fine) == ("HOLD", "OK", "FINE")
    assert isinstance(poison, BackendFailure) and "RuntimeError" in str(poison)


def test_a_backend_that_loses_results_fails_the_batch_instead_of_mismatching_answers() -> None:
    async def scenario() -> None:
        queue: BatchQueue[str, str] = BatchQueue(lambda jobs, gone: [])
        queue.start()
        with pytest.raises(BackendFailure, match="0 results for 1 jobs"):
            await queue.submit(ready("a"))
        await queue.stop()

    asyncio.run(scenario())


def test_batch_settings_are_checked() -> None:
    for bad in ({"max_batch_tokens": 0}, {"max_pending": 0}, {"linger_s": -1.0}):
        with pytest.raises(ValueError):
            BatchSettings(**bad)  # type: ignore[arg-type]


def test_a_running_batch_is_told_when_a_caller_leaves_and_may_leave_its_job_off() -> None:
    """Issue 16 item 6: `gone(i)` turns true for the job whose caller left mid-batch; its place is given back
    when the batch ends, and the job that still has a caller gets its answer."""
    started, carry_on = threading.Event(), threading.Event()
    told: list[bool] = []

    def run(jobs: Sequence[str], gone: Callable[[int], bool]) -> list[str | None]:
        started.set()
        assert carry_on.wait(30)
        told.extend(gone(i) for i in range(len(jobs)))
        return [None if gone(i) else job.upper() for i, job in enumerate(jobs)]

    async def scenario() -> str:
        queue: BatchQueue[str, str] = BatchQueue(run, BatchSettings(linger_s=30.0))
        queue.start()
        leaving = asyncio.create_task(queue.submit(ready("a")))
        staying = asyncio.create_task(queue.submit(ready("b")))
        await until(started.is_set)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert queue.pending == 2, "the worker is still busy with the job that lost its caller"
        carry_on.set()
        answer = await staying
        await until(lambda: queue.pending == 0)
        await queue.stop()
        return answer

    assert asyncio.run(scenario()) == "B"
    assert told == [True, False]


def test_a_job_left_off_while_its_caller_waits_is_a_backend_failure() -> None:
    async def scenario() -> None:
        queue: BatchQueue[str, str] = BatchQueue(lambda jobs, gone: [None for _ in jobs])
        queue.start()
        with pytest.raises(BackendFailure, match="left off"):
            await queue.submit(ready("a"))
        await queue.stop()

    asyncio.run(scenario())
