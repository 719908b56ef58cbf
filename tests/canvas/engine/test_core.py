"""The engine's core loop: calls from several threads share its passes; the store, failures and callers who
leave are handled per call. Gated on the runner's own passes, never on time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from reference import assert_same_read, mixed_reads, tiny_model

from canvasread.canvas.engine.kvstore import KVStore, StoreFull
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import CPU_BATCHES_IN_FLIGHT
from canvasread.canvas.reader import CanvasRead
from canvasread.decide import Decider


class GatedPasses:
    """Wraps a reader's runner and submissions: pass `hold` waits until `release`; `submitted` counts calls."""

    def __init__(self, reader: InProcessReader, hold: int) -> None:
        self.reader, self.hold = reader, hold
        self.entered, self.release = threading.Event(), threading.Event()
        self.submitted = 0
        self.submission = threading.Condition()
        self.rows: list[int] = []  # rows per pass
        run, submit = reader.runner.run, reader.loop.submit

        def gated(rows: Any, store: Any) -> Any:
            if len(self.rows) == self.hold:
                self.entered.set()
                assert self.release.wait(60)
            self.rows.append(len(rows))
            return run(rows, store)

        def counted(work: Any) -> None:
            submit(work)
            with self.submission:
                self.submitted += 1
                self.submission.notify_all()

        reader.runner.run = gated  # type: ignore[method-assign]
        reader.loop.submit = counted  # type: ignore[method-assign]

    def wait_submitted(self, count: int) -> None:
        with self.submission:
            assert self.submission.wait_for(lambda: self.submitted >= count, 60)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def test_a_read_that_arrives_mid_call_rides_in_the_passes_of_another_callers_steps(tiny_decider: Decider) -> None:
    """Caller A reads three-step canvases (3 passes); caller B's one-step read arrives during A's first pass and
    is read in A's second: 3 passes in all, B answered before A, both as each read alone."""
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    steps = [read for read in reads if read.steps == 3]
    lone = next(read for read in reads if read.steps == 1)
    reader = InProcessReader(FusedRunner(model))
    gate = GatedPasses(reader, hold=0)
    first, got_first = in_thread(lambda: reader.read(steps))
    assert gate.entered.wait(60)
    second, got_second = in_thread(lambda: reader.read([lone]))
    gate.wait_submitted(2)
    gate.release.set()
    second.join(60)
    first.join(60)
    assert gate.rows[1] == len(steps) + 2, "A's second steps, B's prompt and B's read share the second pass"
    assert len(gate.rows) == 3, "B took no pass of its own: it was answered a pass before A"
    for read, got in zip([*steps, lone], [*got_first[0], *got_second[0]], strict=True):
        [alone] = InProcessReader(FusedRunner(model)).read([read])
        assert_same_read(read, got, alone)


def test_a_call_the_store_cannot_hold_yet_waits_for_pages_and_one_it_never_can_fails(tiny_decider: Decider) -> None:
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    runner = FusedRunner(model)
    size = KVStore.bytes_per_token(runner.stack.kv_shapes(), runner.stack.embed.weight.dtype) * runner.buckets.page
    longest = max(reads, key=lambda read: len(read.prompt_ids))
    pages = -(-len(longest.prompt_ids) // runner.buckets.page)
    reader = InProcessReader(runner, cache_bytes=size * (pages + 1))  # one such prompt at a time
    held = CanvasRead(longest.prompt_ids, 0, longest.canvas_ids, longest.slots, steps=3, seed=1)
    other = CanvasRead((*longest.prompt_ids[:-1], 7), 0, longest.canvas_ids, longest.slots)
    gate = GatedPasses(reader, hold=0)
    first, got_first = in_thread(lambda: reader.read([held]))
    assert gate.entered.wait(60)
    second, got_second = in_thread(lambda: reader.read([other]))
    gate.wait_submitted(2)
    gate.release.set()
    first.join(60)
    second.join(60)
    assert got_first and got_second, "the second call waited for the first's pages instead of failing"
    assert gate.rows == [2, 1, 1, 2], "the held read's prompt and three steps, then the other's prompt and read"
    [alone] = InProcessReader(FusedRunner(model)).read([other])
    assert_same_read(other, got_second[0][0], alone)
    with pytest.raises(StoreFull):
        reader.read([CanvasRead(longest.prompt_ids * 3, 0, longest.canvas_ids, longest.slots)])


def test_a_failing_pass_fails_the_calls_in_it_and_the_loop_reads_on(tiny_decider: Decider) -> None:
    model = tiny_model(tiny_decider)
    reads = mixed_reads(int(model.config.text_config.vocab_size))
    reader = InProcessReader(FusedRunner(model))
    run = reader.runner.run
    failures = [RuntimeError("a model bug")]

    def failing_once(rows: Any, store: Any) -> Any:
        if failures:
            raise failures.pop()
        return run(rows, store)

    reader.runner.run = failing_once  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a model bug"):
        reader.read(reads[:2])
    reader.cache.make_room(reader.store.pages)
    assert reader.store.free_pages == reader.store.pages, "the failed call's prompts were let go"
    got = reader.read(reads[:2])
    for read, result in zip(reads[:2], got, strict=True):
        [alone] = InProcessReader(FusedRunner(model)).read([read])
        assert_same_read(read, result, alone)


def test_the_engine_backend_reads_several_batches_at_once(tiny_decider: Decider) -> None:
    """What `serve --model` builds on a CPU: the batch queue is allowed the engine's batches in flight there."""
    [served] = tiny_decider.served
    assert served.queue.batches_at_once == CPU_BATCHES_IN_FLIGHT
