"""A model's lanes: requests that think wait in a queue of their own, so a thought never keeps a read waiting."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from helpers import even

from canvasread.backends.base import FunctionBackend
from canvasread.batching import BatchSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.served import ServedModel
from canvasread.types import Capabilities, DecisionRequest
from canvasread.wire import parse_request

NOUL = {"type": "noul", "instructions": "Is it about money?"}


class Thinking(FunctionBackend):
    """Answers reads at once; a request that thinks blocks its batch until `release`, as a long thought would."""

    def __init__(self, think: bool = True) -> None:
        super().__init__(self._answer, name="thinking", capabilities=Capabilities(think=think))
        self.entered, self.release = threading.Event(), threading.Event()

    def _answer(self, request: DecisionRequest) -> list[list[float]]:
        if request.options.think is not None:
            self.entered.set()
            assert self.release.wait(30), "the thought was never released"
        return even(request)


def request(**extra: Any) -> DecisionRequest:
    return parse_request({"model": "m", "state": "I was charged twice.", "questions": {"q": NOUL}, **extra})[1]


def test_only_a_model_that_thinks_has_a_lane_for_thoughts() -> None:
    thinking = ServedModel.of(Thinking(), BatchSettings(), 1)
    assert thinking.thoughts is not None
    assert thinking.queue_for(request(think=8)) is thinking.thoughts
    assert thinking.queue_for(request()) is thinking.queue
    plain = ServedModel.of(Thinking(think=False), BatchSettings(), 1)
    assert plain.queues == [plain.queue]


def test_reads_are_answered_while_a_thought_holds_its_batch() -> None:
    """One batch in flight a lane (a backend that reads no batches at once): in one queue the read would wait for
    the held thought; in its own lane it is answered while the thought is still held."""
    backend = Thinking()
    decider = Decider([backend], DeciderSettings())
    decider.load()

    async def scenario() -> None:
        decider.start()
        try:
            thought = asyncio.ensure_future(decider.decide("default", request(think=8)))
            assert await asyncio.to_thread(backend.entered.wait, 30)
            for _ in range(3):
                decision = await asyncio.wait_for(decider.decide("default", request()), 30)
                assert decision.answers["q"]["noul"] == 0.5
            assert not thought.done()
            backend.release.set()
            assert (await asyncio.wait_for(thought, 30)).answers["q"]["noul"] == 0.5
        finally:
            backend.release.set()
            await decider.stop(5.0)

    asyncio.run(scenario())
