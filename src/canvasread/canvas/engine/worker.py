"""The engine process: the checkpoint, the runner, the KV store and the core loop, apart from the server.

Every torch op releases Python's interpreter lock and takes it back, and a
pass is thousands of them; in the server's own process each take waits for
whichever thread holds the lock then (HTTP parsing, tokenising, readout), up
to the interpreter's switch interval. Measured on a CPU: 3,000 small ops take
18 ms alone and 40 s beside two busy Python threads. So the engine runs in a
process of its own, as vLLM's engine core does: the server plans and reads
out, this process only runs passes. Its main thread takes calls off the pipe
and hands them to the loop (`core.py`); the loop's thread sends each answer
back as its work completes. The server closing the pipe (or dying) ends it.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from canvasread.canvas.engine.factory import fused_reader
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.messages import Answer, Call, Close, Left, Ready, Start, Unloadable
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.works import ReadWork, ThoughtWork, Work

logger = logging.getLogger(__name__)


def run_engine(connection: Connection, start: Start) -> None:
    """The engine process's main: load and warm up, say `Ready` (or `Unloadable`), answer calls until closed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which then closes the pipe
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s canvasread engine process: %(message)s")
    logging.getLogger("canvasread").setLevel(logging.INFO)  # its own start-up choices (the libraries' stay quiet)
    settings = start.settings
    try:
        loaded = load_checkpoint(
            start.spec,
            device=settings.device,
            dtype=settings.dtype,
            experts=settings.experts,
            random_init_std=settings.random_init_std,
        )
        reader = fused_reader(loaded, settings)
    except Exception as error:  # reported as the server's load failure, in one line
        connection.send(Unloadable(f"{type(error).__name__}: {error}"))
        return
    store = reader.store
    connection.send(Ready(loaded.fingerprint, store.pages, store.page, dict(reader.counters()), store.budget))
    Serving(connection, reader).run()


class Serving:
    """Calls from the pipe into the loop, answers back to the pipe (sent from the loop's thread, under a lock)."""

    def __init__(self, connection: Connection, reader: InProcessReader) -> None:
        self.connection = connection
        self.reader = reader
        self.left: dict[int, set[int]] = {}
        self._sending = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                return  # the server is gone
            if isinstance(message, Close):
                return
            if isinstance(message, Left):
                self.left.get(message.number, set()).update(message.indices)
            elif isinstance(message, Call):
                self._start(message)

    def _start(self, call: Call) -> None:
        left = set(call.left)
        self.left[call.number] = left
        work: Work[Any] = (
            ReadWork(call.items, left.__contains__)
            if call.kind == "read"
            else ThoughtWork(call.items, left.__contains__)
        )
        work.on_done = functools.partial(self._answer, call.number)
        self.reader.loop.submit(work)

    def _answer(self, number: int, work: Work[Any]) -> None:
        self.left.pop(number, None)
        counters = dict(self.reader.counters())
        answer = Answer(number, None if work.error is not None else work.results, work.error, counters)
        with self._sending:
            try:
                self.connection.send(answer)
            except (EOFError, OSError):
                return
            except Exception:  # an error that does not pickle still fails its call, by name
                logger.exception("an answer could not be sent as it was")
                failure = RuntimeError(f"{type(work.error).__name__}: {work.error}")
                self.connection.send(Answer(number, None, failure, counters))
