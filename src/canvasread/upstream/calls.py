"""Waiting on the calls a wing sends at once: all of them, or the first failure with the rest cancelled."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any


def wait_all(futures: Sequence[Future[Any]]) -> None:
    """Wait for every call; on the first failure cancel those not started and raise it (the batch fails)."""
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for future in done:
        error = future.exception()
        if error is not None:
            for waiting in pending:
                waiting.cancel()
            raise error
