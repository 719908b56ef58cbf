"""The engine's core loop: one thread runs passes over every work in flight, whoever submitted it.

Callers (the batch workers of the canvas backend, however many batches run
at once) submit works (`works.py`) and wait; the loop's thread owns the
runner, the KV store and the prompts in it. Each cycle, as vLLM's engine
core steps:

1. admit what arrived, oldest first (its prompts placed in the store; a
   work that does not fit waits while work in flight holds pages, and
   fails with `StoreFull` when nothing does);
2. drop the tasks whose caller has gone;
3. pack the next pass (`scheduler.pack`: a token budget shared by every
   prompt's encoding and reads, in turns, oldest first, with thoughts in
   what is left: beside reads one thought's step, within the thoughts'
   `Share` of the time; only thoughts, once no read has come for a while:
   `hold`) and run it;
4. hand each row's output to its task, file finished tasks' results and
   complete the works with none left.

So a re-read of one request rides in the pass that reads another's first
canvases, and a thought's denoising steps interleave with other requests'
reads instead of holding them. The thread starts with the first work and
ends when none is left (no thread to stop; a reader dropped is collected).
A pass that fails fails every work in flight, as a failed batch fails its
jobs: the batch queue then retries each job alone.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from canvasread.canvas.engine.kvstore import KVStore, PromptCache, StoreFull
from canvasread.canvas.engine.prompts import PlacedPrompt, PromptTable
from canvasread.canvas.engine.rows import Row, RowOutput
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.scheduler import Share, Sized, pack
from canvasread.canvas.engine.settings import DEFAULT_THOUGHT_SHARE
from canvasread.canvas.engine.tasks import Kit, Unit
from canvasread.canvas.engine.works import ThoughtWork, Work

logger = logging.getLogger(__name__)

# How long the interpreter's exit waits for a loop's thread to finish the pass it is in.
EXIT_WAIT_S = 10.0


@dataclass
class PassCounters:
    passes: int = 0
    pass_tokens: int = 0
    pass_rows: int = 0
    denoising_steps: int = 0
    # The runner's wall time. A read's label results reach the host inside it; a thought's or a step's logits stay
    # on the device until its draw, so that GPU time falls in `draw_seconds`: the host work after the runner
    # (answers, draws and their syncs). Busy time is the two together.
    pass_seconds: float = 0.0
    draw_seconds: float = 0.0


class EngineCore:
    """The state of the engine between passes; every method but `submit` runs on the loop's thread."""

    def __init__(
        self,
        runner: FusedRunner,
        store: KVStore,
        *,
        max_rows: int,
        pass_tokens: int | None = None,
        thought_share: float = DEFAULT_THOUGHT_SHARE,
    ) -> None:
        self.runner = runner
        self.table = PromptTable(store, PromptCache(store), runner)
        self.kit = Kit.of(runner)
        self.max_rows = max_rows
        self.pass_tokens = min(pass_tokens or runner.buckets.max_tokens, runner.buckets.max_tokens)
        self.stats = PassCounters()
        self.admitted: Counter[str] = Counter(reads=0, thoughts=0)  # items admitted (their callers waited)
        self._waiting: deque[Work[Any]] = deque()
        self._works: list[Work[Any]] = []
        self._reads_until = 0.0  # until then a read may be on its way: the last reading pass's end plus its length
        self.share = Share(thought_share)  # of the engine's time, to thoughts in passes that read

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._works

    def counters(self) -> Mapping[str, float]:
        counted: dict[str, float] = {**vars(self.stats), **vars(self.table.stats), **self.admitted}
        counted.update(kv_cache_entries=len(self.table.cache), kv_store_free_pages=self.table.store.free_pages)
        return counted

    def cycle(self, arrived: list[Work[Any]]) -> None:
        """Admit, drop the departed, run one pass, file what finished (the module docstring's steps)."""
        self._waiting.extend(arrived)
        self._admit()
        for work in self._works:
            for task in [task for task in work.tasks if work.gone(task.index)]:
                work.file(task, self.table)
        if any(work.tasks for work in self._works):
            self._pass()
        self._complete()

    def fail_all(self, error: BaseException) -> None:
        """Fail every work admitted or waiting (a pass failed, or the loop itself did)."""
        for work in [*self._works, *self._waiting]:
            work.fail(error, self.table)
        self._works.clear()
        self._waiting.clear()

    def _admit(self) -> None:
        while self._waiting:
            work = self._waiting[0]
            try:
                work.admit(self.table, self.kit)
            except StoreFull as error:
                if any(w.tasks for w in self._works):
                    return  # pages come back as the work in flight finishes
                self._waiting.popleft()
                work.fail(error, self.table)
                continue
            except Exception as error:  # an image the vision tower cannot take fails its own call only
                self._waiting.popleft()
                work.fail(error, self.table)
                continue
            self._waiting.popleft()
            self._works.append(work)
            self.admitted[work.kind] += len(work.tasks)

    def hold(self) -> float:
        """Seconds to keep the thoughts in flight waiting for a read that may be on its way (0: pass now).

        A pass cannot be cut short, and one that only steps thoughts takes about as long as a reading pass: a read
        arriving just after it starts waits that long. So while only thoughts are in flight, they wait until no
        read has come for the length of the last reading pass (a closed-loop client's next read comes sooner).
        """
        if self._waiting or self.idle or any(work.tasks and work.kind != ThoughtWork.kind for work in self._works):
            return 0.0
        return max(0.0, self._reads_until - time.monotonic())

    def _pass(self) -> None:
        reads, thoughts = self._queues()
        if not reads and self.hold() > 0:
            return
        contended = bool(reads) and any(thoughts)
        if not contended:
            self.share.forget()
        # Beside reads one thought steps, so a read never waits on many, and only within the thoughts' share.
        stepping = None if not reads else 1 if self.share.allows() or not contended else 0
        units = pack(
            reads, budget=self.pass_tokens, max_rows=self.max_rows, background=thoughts, background_queues=stepping
        )
        if not units:
            raise ValueError(f"a row is over the engine's pass of {self.pass_tokens} tokens")
        rows = [unit.row for unit in units]
        started = time.monotonic()
        outputs = self.runner.run(rows, self.table.store)
        ended = time.monotonic()
        ran = ended - started
        if reads:
            self._reads_until = ended + ran
        self._count(rows, ran)
        read_units = {id(sized.unit) for queue in reads for sized in queue}
        outputs_by_unit = list(zip(units, outputs, strict=True))
        for unit, output in [(unit, output) for unit, output in outputs_by_unit if id(unit) in read_units]:
            unit.then(output)
        self._complete()  # the reads' callers go on while the thoughts take their draws (a host sync each)
        drawing = time.monotonic()
        background = [(unit, output) for unit, output in outputs_by_unit if id(unit) not in read_units]
        for unit, output in background:
            unit.then(output)
        if contended:  # the pass's time by its tokens, and the draws after it, to background work
            share = sum(len(unit.row.ids) for unit, _ in background) / sum(len(row.ids) for row in rows)
            self.share.spent(reads=ran * (1 - share), background=ran * share + time.monotonic() - drawing)
        self.stats.draw_seconds += time.monotonic() - ended

    def _count(self, rows: list[Row], seconds: float) -> None:
        self.stats.pass_seconds += seconds
        self.stats.passes += 1
        self.stats.pass_rows += len(rows)
        self.stats.pass_tokens += sum(len(row.ids) for row in rows)
        self.stats.denoising_steps += sum(row.canvas_hidden for row in rows)

    def _queues(self) -> tuple[list[list[Sized[Unit]]], list[list[Sized[Unit]]]]:
        """One queue per prompt in flight, oldest first: its encoding rows, then each task's next step; the
        queues of prompts that only thoughts read apart (the scheduler's background)."""
        tasks: dict[int, list[Any]] = {}
        thought_only: dict[int, bool] = {}
        for work in self._works:
            for task in work.tasks:
                key = id(task.prompt)
                tasks.setdefault(key, []).append(task)
                thought_only[key] = thought_only.get(key, True) and work.kind == ThoughtWork.kind
        reads: list[list[Sized[Unit]]] = []
        thoughts: list[list[Sized[Unit]]] = []
        for key, owned in sorted(tasks.items(), key=lambda item: item[1][0].prompt.order):
            prompt = owned[0].prompt
            ran = functools.partial(self._chunk_ran, prompt)
            queue = [Sized(Unit(chunk, ran), len(chunk.ids)) for chunk in prompt.chunks]
            (thoughts if thought_only[key] else reads).append(queue + [u for task in owned for u in task.units()])
        return reads, thoughts

    def _chunk_ran(self, prompt: PlacedPrompt, output: RowOutput) -> None:
        """One of the prompt's encoding rows ran (they run in order): after its last, the prompt is cached."""
        prompt.chunks.popleft()
        self.table.encoded(prompt)

    def _complete(self) -> None:
        for work in list(self._works):
            for task in [task for task in work.tasks if task.finished]:
                work.file(task, self.table)
            if not work.tasks:
                self._works.remove(work)
                work.complete()


class EngineLoop:
    """Runs an `EngineCore` on a thread of its own while it has work (see the module docstring)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._lock = threading.Lock()
        self._woken = threading.Condition(self._lock)  # a work arrived
        self._arrived: list[Work[Any]] = []
        self._running = False
        self._thread: threading.Thread | None = None
        _LOOPS.add(self)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the loop's thread, if one is running, to end."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def submit(self, work: Work[Any]) -> None:
        """Hand `work` to the loop (starting its thread if it is not running); the caller then waits on it."""
        with self._lock:
            self._arrived.append(work)
            self._woken.notify()
            if self._running:
                return
            self._running = True
            self._thread = threading.Thread(target=self._run, name="canvasread-engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        device = self.core.runner.stack.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            with torch.inference_mode():
                while True:
                    with self._lock:
                        if not self._arrived and (hold := self.core.hold()) > 0:
                            self._woken.wait(hold)
                        arrived, self._arrived = self._arrived, []
                        if not arrived and self.core.idle:
                            self._running = False
                            return
                    try:
                        self.core.cycle(arrived)
                    except Exception as error:  # a model bug fails the work in flight, never the loop
                        logger.error("an engine pass failed", exc_info=error)
                        self.core.fail_all(error)
        except BaseException as error:  # the thread itself is going (interpreter exit): no caller waits forever
            with self._lock:
                self.core.fail_all(error)
                for work in self._arrived:
                    work.fail(error, self.core.table)
                self._arrived, self._running = [], False
            raise


# Every loop alive, for the exit hook below (weakly: a loop nobody holds goes with its model and store).
_LOOPS: weakref.WeakSet[EngineLoop] = weakref.WeakSet()


@atexit.register
def _finish_loops() -> None:
    """At exit, let each loop's thread end before the interpreter finalizes: a daemon thread still freeing a
    pass's tensors then (they release and retake the interpreter lock) is killed inside C++ and the process
    aborts (`terminate called without an active exception`) after the program's own work was done."""
    for loop in list(_LOOPS):
        loop.join(EXIT_WAIT_S)
