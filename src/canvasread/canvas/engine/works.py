"""A caller's call in flight in the engine: a `read` of canvases or a `think` of thoughts, one task per item.

The caller's thread submits a work and waits on it; the engine's thread
admits it (places its prompts in the store, so it can fail there with
`StoreFull`), runs its tasks' rows in passes beside every other work's,
files each task's result as it finishes and completes the work when none
is left. An item whose caller has gone (`gone(i)`) is never admitted, or is
dropped between passes, and gets the empty result of its kind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from canvasread.backends.base import Gone
from canvasread.canvas.engine.generation import Generation
from canvasread.canvas.engine.prompts import PlacedPrompt, PromptTable
from canvasread.canvas.engine.scheduler import Sized
from canvasread.canvas.engine.tasks import Kit, ReadTask, ThoughtTask, Unit
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.thinker import Thought, ThoughtRequest

ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)


class Task(Protocol[ResultT_co]):
    """What the engine needs of a task (`tasks.py`)."""

    @property
    def index(self) -> int: ...

    @property
    def prompt(self) -> PlacedPrompt: ...

    @property
    def finished(self) -> bool: ...

    @property
    def result(self) -> ResultT_co | None: ...

    def units(self) -> list[Sized[Unit]]: ...

    def release(self, table: PromptTable) -> None: ...


class Work(Generic[ResultT]):
    """A call's tasks and results; `left` is the result of an item whose caller has gone. `kind` names what its
    items are in the engine's counters."""

    kind = "items"

    def __init__(self, size: int, gone: Gone, left: ResultT | None) -> None:
        self.results: list[ResultT | None] = [left] * size
        self.gone = gone
        self.tasks: list[Task[ResultT]] = []
        self._done = threading.Event()
        self._error: BaseException | None = None
        # Called (on the engine's thread) once the work is complete or failed, for a caller that does not wait.
        self.on_done: Callable[[Work[ResultT]], None] | None = None

    def admit(self, table: PromptTable, kit: Kit) -> None:
        """Create the tasks of the items whose caller still waits (their prompts placed); on `StoreFull`, or any
        failure, let go of what was taken and raise."""
        tasks: list[Task[ResultT]] = []
        try:
            for index in range(len(self.results)):
                if not self.gone(index):
                    tasks.append(self._task(index, table, kit))
        except BaseException:
            for task in tasks:
                task.release(table)
            raise
        self.tasks = tasks

    def _task(self, index: int, table: PromptTable, kit: Kit) -> Task[ResultT]:
        raise NotImplementedError

    def file(self, task: Task[ResultT], table: PromptTable) -> None:
        """A task is finished (its result filed) or dropped (the empty result stays): its prompt is let go."""
        if task.finished:
            self.results[task.index] = task.result
        self.tasks.remove(task)
        task.release(table)

    def complete(self) -> None:
        self._done.set()
        if self.on_done is not None:
            self.on_done(self)

    def fail(self, error: BaseException, table: PromptTable) -> None:
        for task in self.tasks:
            task.release(table)
        self.tasks = []
        self._error = error
        self.complete()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def wait(self) -> list[ResultT | None]:
        """The results, once the engine has completed the work (raises what failed it)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self.results


class ReadWork(Work[list[SlotLogProbs]]):
    """A `Reader.read` call: one `ReadTask` per canvas read (a departed caller's read: an empty list)."""

    kind = "reads"

    def __init__(self, reads: Sequence[CanvasRead], gone: Gone) -> None:
        super().__init__(len(reads), gone, [])
        self.reads = reads

    def _task(self, index: int, table: PromptTable, kit: Kit) -> Task[list[SlotLogProbs]]:
        read = self.reads[index]
        return ReadTask(index, read, table.use(read.prompt_ids, read.prefix_length, read.images), kit)


class ThoughtWork(Work[Thought]):
    """A `Thinker.think` call: one `ThoughtTask` per thought (a departed caller's: None), each with the slots
    of every block but its last reserved at admission."""

    kind = "thoughts"

    def __init__(self, requests: Sequence[ThoughtRequest], gone: Gone) -> None:
        super().__init__(len(requests), gone, None)
        self.requests = requests

    def _task(self, index: int, table: PromptTable, kit: Kit) -> Task[Thought]:
        request = self.requests[index]
        generation = Generation(
            request, kit.schedule, canvas_length=kit.canvas_length, vocab=kit.vocab, device=kit.device
        )
        prompt = table.use(request.prompt_ids, request.prefix_length, request.images)
        try:
            blocks = table.reserve((generation.blocks - 1) * kit.canvas_length)
        except BaseException:
            table.let_go(prompt)
            raise
        return ThoughtTask(index, prompt, blocks, generation, kit)
