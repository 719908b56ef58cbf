"""The server's side of the engine process (`worker.py`): a `Reader` and `Thinker` whose calls go over a pipe.

Each call is numbered and sent, with the items whose callers have already
left; the caller's thread waits for its answer. Meanwhile one watching
thread tells the engine which items' callers have left since (it polls
every sent call's `gone` every `LEFT_POLL_S`, while any waits, and never a
call not yet sent, whose news the engine could not place), so their work
stops between passes as in process; with dozens of
batches in flight, one thread polling beats each caller waking 50 times a
second. One thread receives every answer and keeps the engine's latest
counters. If the engine process dies, every waiting call fails with a 503,
and so does every later one while a new engine process loads (`health_problem`
says why): the death is logged and the engine started again, at once after a
life of a minute or more, else after a pause that doubles (1 s to a minute)
while it keeps dying young. An engine that cannot load again stays down.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.engine.launch import CLOSE_WAIT_S, EngineUnloadable, Launch, Link, stop
from canvasread.canvas.engine.messages import Answer, Call, CallKind, Close, Left
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.thinker import Thought, ThoughtRequest
from canvasread.errors import NotReady

logger = logging.getLogger(__name__)
# How often a waiting call checks whether its items' callers have left.
LEFT_POLL_S = 0.02
# An engine process that lived this long is started again at once when it dies; one that died younger waits a
# pause that doubles from 1 s up to MAX_RESTART_PAUSE_S, so an engine that keeps dying does not spin.
STABLE_S = 60.0
MAX_RESTART_PAUSE_S = 60.0


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
    """Reads and thinks through an engine process, started again when it dies; callable from any number of
    threads."""

    stops_departed_reads = True

    def __init__(self, link: Link, spec: str, settings: EngineSettings) -> None:
        self.ready = link.ready
        self._link = link
        # An engine started in this one's place gets its store's budget: the GPU's default (a share of the memory
        # free after start-up) could size it otherwise, and the server plans with this one's pages.
        self._spec, self._settings = spec, replace(settings, cache_bytes=link.ready.store_bytes)
        self._numbers = itertools.count()
        self._waiting: dict[int, _Waiting] = {}
        self._calls = threading.Condition()  # a call began waiting, or the server is closing
        self._sending = threading.Lock()
        self._counters: Mapping[str, float] = link.ready.counters
        self._dead: str | None = None
        self._closing = threading.Event()
        self._launch: Launch | None = None  # a new engine process loading
        self._started = time.monotonic()
        self._pause = 0.0
        self._receiving(link)
        threading.Thread(target=self._watch, name="canvasread-engine-departures", daemon=True).start()
        # Before multiprocessing's own exit handler, which would wait for the engine process forever: the engine
        # ends when told to or when this end of the pipe closes, and that happens only at exit.
        atexit.register(self.close)

    @classmethod
    def start(cls, spec: str, settings: EngineSettings) -> EngineClient:
        """Start the engine process and wait until it has loaded and warmed up (or say why it could not)."""
        return cls(Launch(spec, settings).wait(), spec, settings)

    def read(self, reads: Sequence[CanvasRead], gone: Gone = never_gone) -> list[list[SlotLogProbs]]:
        return [result if result is not None else [] for result in self._call("read", reads, gone)]

    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]:
        return list(self._call("think", requests, gone))

    @property
    def pid(self) -> int | None:
        """The engine process's id (for operators' tools and tests)."""
        return self._link.process.pid

    def counters(self) -> Mapping[str, float]:
        """The engine's counters as of its last answer."""
        return dict(self._counters)

    def health_problem(self) -> str | None:
        return self._dead

    def close(self) -> None:
        """Ask the engine process to stop, and make sure it has (and that none is starting again)."""
        with self._calls:
            self._closing.set()
            self._calls.notify_all()
            launch = self._launch
        if launch is not None:
            launch.stop()
        process = self._link.process
        if process.is_alive():
            with contextlib.suppress(OSError):
                self._send(Close())
            process.join(CLOSE_WAIT_S)
        stop(process)

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
            self._link.connection.send(message)

    def _watch(self) -> None:
        """Poll the sent calls' callers while any call waits; tell the engine of each item whose caller left."""
        while not self._closing.is_set():
            with self._calls:
                while not (calls := self._sent()) and not self._closing.is_set():
                    self._calls.wait()
            for number, waiting in calls:
                if left := waiting.departed():
                    with contextlib.suppress(OSError):  # the pipe broke: the receiving thread says so
                        self._send(Left(number, left))
            time.sleep(LEFT_POLL_S)

    def _sent(self) -> list[tuple[int, _Waiting]]:
        """The waiting calls already sent (the receiving thread pops answered calls without the lock: the dict is
        copied in one step first)."""
        return [(number, waiting) for number, waiting in list(self._waiting.items()) if waiting.sent]

    def _receiving(self, link: Link) -> None:
        threading.Thread(target=self._receive, args=(link,), name="canvasread-engine-answers", daemon=True).start()

    def _receive(self, link: Link) -> None:
        while True:
            try:
                answer = link.connection.recv()
            except (EOFError, OSError):
                break
            self._counters = answer.counters
            waiting = self._waiting.pop(answer.number, None)
            if waiting is not None:
                waiting.answer = answer
                waiting.done.set()
        link.process.join(1.0)
        self._ended(f"the engine process has ended (exit code {link.process.exitcode})")

    def _ended(self, ended: str) -> None:
        """Fail every waiting call; unless the server is closing, say so and start the engine again."""
        with self._calls:
            again = not self._closing.is_set()
            if again:  # logged before the death is told (`health_problem`), so whoever learns of it finds the log
                logger.error("%s: its calls failed with 503, and it is starting again", ended)
            self._dead = f"{ended}; it is starting again" if again else ended
            for number in list(self._waiting):
                self._waiting.pop(number).done.set()
            self._calls.notify_all()
        if again:
            threading.Thread(target=self._restart, args=(ended,), name="canvasread-engine-restart", daemon=True).start()

    def _restart(self, ended: str) -> None:
        """A new engine process in the dead one's place, after the pause its short life earned."""
        young = time.monotonic() - self._started < STABLE_S
        self._pause = min(MAX_RESTART_PAUSE_S, max(1.0, 2 * self._pause)) if young else 0.0
        if self._closing.wait(self._pause):
            return
        with self._calls:
            if self._closing.is_set():
                return
            launch = self._launch = Launch(self._spec, self._settings)
        try:
            link = launch.wait()
        except EngineUnloadable as error:
            with self._calls:
                self._launch = None
                if self._closing.is_set():  # stopped by close() while it loaded
                    return
                self._dead = f"{ended}, and starting it again failed: {error}"
            logger.error("%s", self._dead)
            return
        with self._calls:
            self._launch = None
            if self._closing.is_set():
                stop(link.process)
                return
            self._link, self._counters, self._dead = link, link.ready.counters, None
            self._started = time.monotonic()
        self._receiving(link)
        logger.warning("the engine process started again (pid %s) and answers", link.process.pid)
