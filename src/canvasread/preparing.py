"""`PreparePool`: the few threads that prepare requests (tokenising, planning) for one served model.

Preparing a request is CPU work on its own text, and a hostile text (megabytes without a space, a question
named by a thousand others) can take seconds. On threads of their own, that work waits only for other
preparations, never for what the server's shared threads do (parsing bodies, loading models), and at most
`workers` of them run at once. A request whose caller leaves (its deadline, a hang-up) is cancelled while it
waits: its preparation never starts; one already running is told, and a backend that prepares in steps stops
at the next one (`canvasread.backends.base.stop_if_left`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from canvasread.backends.base import watching

T = TypeVar("T")
# Requests prepared at once per model: a busy 2-core machine keeps both cores on it while a slow one runs.
DEFAULT_PREPARE_WORKERS = 4


class PreparePool:
    """Runs one request's preparation at a time per thread, `workers` threads at most (see the module docstring)."""

    def __init__(self, workers: int = DEFAULT_PREPARE_WORKERS, name: str = "model") -> None:
        if workers < 1:
            raise ValueError("a prepare pool needs at least one worker")
        self._workers = workers
        self._name = name
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` on a pool thread; cancelling the caller cancels it if queued and tells it if running."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix=f"canvasread-prepare-{self._name}")
        left = threading.Event()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, watching, left, work)
        finally:
            left.set()  # done or abandoned: either way nobody waits for more of this work

    def close(self) -> None:
        """Drop what is queued; a preparation still running ends on its own (it cannot be interrupted)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
