"""Stop working for clients that have gone.

Starlette does not cancel a route when its client hangs up, so a client that
timed out would still have its request read by the model. Once the body has
been read, the next ASGI `receive()` returns only when the client disconnects;
racing it against the work and cancelling the loser drops the queued job (the
batch loop skips cancelled futures) before it reaches the model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

from canvasread.errors import ClientDisconnected

T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Run `work` unless the client hangs up first; then cancel it and raise `ClientDisconnected` (499).

    Call only after the request body has been read: `receive` is consumed.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (watcher, task):  # also when this coroutine itself is cancelled (server shutdown)
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.cancelled():
        raise ClientDisconnected("the client closed the connection before its answer was ready")
    return task.result()
