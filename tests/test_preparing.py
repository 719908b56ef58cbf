"""Preparation runs on a bounded pool of its own and stops with its request (issue 28): a caller that has gone
leaves no preparation queued, and one running ends at its next step."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import even

from canvasread.backends.base import FunctionBackend, PreparationStopped, stop_if_left, watching
from canvasread.decide import Decider, DeciderSettings
from canvasread.errors import DeadlineExceeded
from canvasread.preparing import PreparePool
from canvasread.types import DecisionRequest
from canvasread.wire import parse_request

STEPS = 1000


class Held(FunctionBackend):
    """Prepares a state that starts with "hold" once `release` is set, then in `STEPS` steps, each checking
    whether its caller has gone; records every state it began to prepare."""

    def __init__(self) -> None:
        super().__init__(even)
        self.started, self.release, self.stopped = threading.Event(), threading.Event(), threading.Event()
        self.steps = 0
        self.prepared: list[str] = []

    def prepare(self, request: DecisionRequest) -> DecisionRequest:
        self.prepared.append(str(request.state))
        if str(request.state).startswith("hold"):
            self.started.set()
            assert self.release.wait(30)
            try:
                for _ in range(STEPS):
                    stop_if_left()
                    self.steps += 1
            except PreparationStopped:
                self.stopped.set()
                raise
        return request


def asking(state: str) -> DecisionRequest:
    return parse_request(
        {"model": "default", "state": state, "questions": {"q": {"type": "noul", "instructions": "?"}}}
    )[1]


def test_a_preparation_whose_caller_has_gone_stops_at_its_next_step() -> None:
    backend = Held()
    decider = Decider([backend], DeciderSettings(timeout_s=0.5))
    decider.load()

    async def scenario() -> None:
        decider.start()
        try:
            with pytest.raises(DeadlineExceeded):
                await decider.decide("default", asking("hold"))  # the deadline passes while it is held
            backend.release.set()
            assert await asyncio.to_thread(backend.stopped.wait, 30)
            assert backend.steps == 0, "it went on after its caller had gone"
        finally:
            backend.release.set()
            await decider.stop(5.0)

    asyncio.run(scenario())


def test_a_preparation_queued_behind_a_full_pool_never_starts_once_its_caller_has_gone() -> None:
    backend = Held()
    decider = Decider([backend], DeciderSettings(timeout_s=1.0, prepare_workers=1))
    decider.load()

    async def scenario() -> None:
        decider.start()
        try:
            held = asyncio.create_task(decider.decide("default", asking("hold")))
            assert await asyncio.to_thread(backend.started.wait, 30)  # the pool's one thread is taken
            with pytest.raises(DeadlineExceeded):
                await decider.decide("default", asking("queued"))
            with pytest.raises(DeadlineExceeded):
                await held
            backend.release.set()
            assert await asyncio.to_thread(backend.stopped.wait, 30)
            answered = await decider.decide("default", asking("after"))
            assert answered.answers["q"]["type"] == "noul"
            assert backend.prepared == ["hold", "after"]  # "queued" was dropped, never prepared
        finally:
            backend.release.set()
            await decider.stop(5.0)

    asyncio.run(scenario())


def test_stop_if_left_is_a_no_op_outside_the_pool_and_watches_its_own_request_inside() -> None:
    stop_if_left()  # the library's synchronous callers always wait
    left, kept = threading.Event(), threading.Event()
    left.set()
    with pytest.raises(PreparationStopped):
        watching(left, stop_if_left)
    assert watching(kept, lambda: "done") == "done"


def test_a_pool_takes_at_least_one_worker() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        PreparePool(0)
