"""The server's side of the engine process (`worker.py`): a `Reader` and `Thinker` whose calls go over a pipe.

Each call is numbered and sent, with the items whose callers have already
left; the caller's thread waits for its answer. Meanwhile one watching
thread tells the engine which items' callers have left since (it polls
every sent call's `gone` every `LEFT_POLL_S`, while any waits, and never a
call not yet sent, whose news the engine could not place), so their work
stops between passes as in process; with dozens of
batches in flight, one thread polling beats each caller waking 50 times a
second. One thread receives every answer and keeps the engine's latest
counters. If the engine process dies, every waiting call and every later
one fails with a 503 and `health_problem` says why.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.engine.messages import Answer, Call, CallKind, Close, Left, Ready, Start, Unloadable
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.thinker import Thought, ThoughtRequest
from canvasread.errors import NotReady

logger = logging.getLogger(__name__)
# How often a waiting call checks whether its items' callers have left.
LEFT_POLL_S = 0.02
# How long closing waits for the engine process to end before it is terminated.
CLOSE_WAIT_S = 5.0


class EngineUnloadable(RuntimeError):
    """The engine process could not load the checkpoint, or ended before it was ready."""


@dataclass
class _Waiting:
    items: int
    gone: Gone
    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | None = None
    told: set[int] = field(default_factory=set)  # items the engine was told have left
    sent: bool = False  # the call is on the pipe: the watcher's from now on

    def departed(self) -> tuple[int, ...]:
        """The items whose callers have left since the last time asked."""
        left = tuple(i for i in range(self.items) if i not in self.told and self.gone(i))
        self.told.update(left)
        return left


class EngineClient:
    """Reads and thinks through an engine process; callable from any number of threads."""

    stops_departed_reads = True

    def __init__(self, process: BaseProcess, connection: Connection, ready: Ready) -> None:
        self.ready = ready
        self._process = process
        self._connection = connection
        self._numbers = itertools.count()
        self._waiting: dict[int, _Waiting] = {}
        self._calls = threading.Condition()  # a call began waiting
        self._sending = threading.Lock()
        self._counters: Mapping[str, float] = ready.counters
        self._dead: str | None = None
        self._closing = False
        threading.Thread(target=self._receive, name="canvasread-engine-answers", daemon=True).start()
        threading.Thread(target=self._watch, name="canvasread-engine-departures", daemon=True).start()
        # Before multiprocessing's own exit handler, which would wait for the engine process forever: the engine
        # ends when told to or when this end of the pipe closes, and that happens only at exit.
        atexit.register(self.close)

    @classmethod
    def start(cls, spec: str, settings: EngineSettings) -> EngineClient:
        """Start the engine process and wait until it has loaded and warmed up (or say why it could not)."""
        from canvasread.canvas.engine.worker import run_engine

        context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        ours, theirs = context.Pipe()
        process = context.Process(target=run_engine, args=(theirs, Start(spec, settings)), name="canvasread-engine")
        process.start()
        theirs.close()
        try:
            message = _first_message(process, ours)
        except EOFError:
            message = Unloadable(f"the engine process ended (exit code {process.exitcode}) before it was ready")
        if isinstance(message, Unloadable):
            process.join()
            raise EngineUnloadable(message.reason)
        assert isinstance(message, Ready)
        return cls(process, ours, message)

    def read(self, reads: Sequence[CanvasRead], gone: Gone = never_gone) -> list[list[SlotLogProbs]]:
        return [result if result is not None else [] for result in self._call("read", reads, gone)]

    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]:
        return list(self._call("think", requests, gone))

    @property
    def pid(self) -> int | None:
        """The engine process's id (for operators' tools and tests)."""
        return self._process.pid

    def counters(self) -> Mapping[str, float]:
        """The engine's counters as of its last answer."""
        return dict(self._counters)

    def health_problem(self) -> str | None:
        return self._dead

    def close(self) -> None:
        """Ask the engine process to stop, and make sure it has."""
        self._closing = True
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._send(Close())
            self._process.join(CLOSE_WAIT_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(CLOSE_WAIT_S)

    def _call(self, kind: CallKind, items: Sequence[Any], gone: Gone) -> Sequence[Any]:
        if not items:
            return []
        number = next(self._numbers)
        waiting = _Waiting(len(items), gone)
        with self._calls:  # with the receiving thread's last sweep: a call is either swept or told the engine ended
            if self._dead is not None:
                raise NotReady(self._dead)
            self._waiting[number] = waiting
        try:
            self._send(Call(number, kind, list(items), waiting.departed()))
            with self._calls:
                waiting.sent = True
                self._calls.notify()
            waiting.done.wait()  # set by the receiving thread: the answer, or the engine's end
        except OSError:
            pass  # the pipe broke: the engine has ended, and the receiving thread says so
        finally:
            with self._calls:
                self._waiting.pop(number, None)
        answer = waiting.answer
        if answer is None:
            raise NotReady(self._dead or "the engine process has ended")
        if answer.error is not None:
            raise answer.error
        assert answer.results is not None
        return answer.results

    def _send(self, message: object) -> None:
        with self._sending:
            self._connection.send(message)

    def _watch(self) -> None:
        """Poll the sent calls' callers while any call waits; tell the engine of each item whose caller left."""
        while self._dead is None:
            with self._calls:
                while not (calls := self._sent()) and self._dead is None:
                    self._calls.wait()
            for number, waiting in calls:
                if left := waiting.departed():
                    try:
                        self._send(Left(number, left))
                    except OSError:
                        return  # the pipe broke: the receiving thread says so
            time.sleep(LEFT_POLL_S)

    def _sent(self) -> list[tuple[int, _Waiting]]:
        """The waiting calls already sent (the receiving thread pops answered calls without the lock: the dict is
        copied in one step first)."""
        return [(number, waiting) for number, waiting in list(self._waiting.items()) if waiting.sent]

    def _receive(self) -> None:
        while True:
            try:
                answer = self._connection.recv()
            except (EOFError, OSError):
                break
            self._counters = answer.counters
            waiting = self._waiting.pop(answer.number, None)
            if waiting is not None:
                waiting.answer = answer
                waiting.done.set()
        self._process.join(1.0)
        ended = f"the engine process has ended (exit code {self._process.exitcode})"
        if not self._closing:  # nothing restarts it: the model answers 503 from now on
            logger.error("%s; this model answers 503 until the server is restarted", ended)
        with self._calls:
            self._dead = ended
            for number in list(self._waiting):
                self._waiting.pop(number).done.set()
            self._calls.notify()


def _first_message(process: BaseProcess, connection: Connection) -> object:
    """What the engine process says first (its load takes a while); EOFError if it ends without a word."""
    while not connection.poll(1.0):
        if not process.is_alive():
            process.join()
            raise EOFError
    return connection.recv()
