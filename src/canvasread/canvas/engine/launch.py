"""Starting the engine process (`worker.py`): spawned, then waited on until it has loaded and warmed up.

The server starts one at load, and again whenever one dies (`client.py`).
The wait is a `Launch` of its own, so a server shutting down can end a
start still under way instead of waiting out a load of a minute.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from canvasread.canvas.engine.messages import Ready, Start, Unloadable
from canvasread.canvas.engine.settings import EngineSettings

# How long stopping waits for the engine process to end before it is terminated.
CLOSE_WAIT_S = 5.0


class EngineUnloadable(RuntimeError):
    """The engine process could not load the checkpoint, or ended before it was ready."""


@dataclass(frozen=True)
class Link:
    """A ready engine process and the server's end of its pipe."""

    process: BaseProcess
    connection: Connection
    ready: Ready


class Launch:
    """An engine process spawned and not yet ready."""

    def __init__(self, spec: str, settings: EngineSettings) -> None:
        from canvasread.canvas.engine.worker import run_engine

        context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self.connection, theirs = context.Pipe()
        self.process = context.Process(
            target=run_engine, args=(theirs, Start(spec, settings)), name="canvasread-engine"
        )
        self.process.start()
        theirs.close()

    def wait(self) -> Link:
        """The ready process, once it says so; EngineUnloadable with its reason when it cannot load, or ends (or
        is stopped) first."""
        try:
            message = self._first_message()
        except (EOFError, OSError):
            self.process.join(CLOSE_WAIT_S)
            message = Unloadable(f"the engine process ended (exit code {self.process.exitcode}) before it was ready")
        if isinstance(message, Unloadable):
            self.process.join(CLOSE_WAIT_S)
            stop(self.process)
            raise EngineUnloadable(message.reason)
        assert isinstance(message, Ready)
        return Link(self.process, self.connection, message)

    def stop(self) -> None:
        """End the process now (a shutdown during its load)."""
        stop(self.process)

    def _first_message(self) -> object:
        """What the process says first (its load takes a while); EOFError if it ends without a word."""
        while not self.connection.poll(1.0):
            if not self.process.is_alive():
                raise EOFError
        return self.connection.recv()


def stop(process: BaseProcess) -> None:
    """Terminate `process` if it still runs, and reap it."""
    if process.is_alive():
        process.terminate()
        process.join(CLOSE_WAIT_S)
