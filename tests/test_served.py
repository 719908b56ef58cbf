"""A model's lanes: requests that think wait in a queue of their own, so a thought never keeps a read waiting."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers import GatedBackend

from canvasread.batching import BatchSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.served import ServedModel
from canvasread.types import Capabilities, DecisionRequest
from canvasread.wire import parse_request

NOUL = {"type": "noul", "instructions": "Is it about money?"}
THINKS = Capabilities(think=True)


def request(state: str = "I was charged twice.", **extra: Any) -> DecisionRequest:
    return parse_request({"model": "m", "state": state, "questions": {"q": NOUL}, **extra})[1]


def test_only_a_model_that_thinks_has_a_lane_for_thoughts() -> None:
    thinking = ServedModel.of(GatedBackend(capabilities=THINKS), BatchSettings(), 1)
    assert thinking.thoughts is not None
    assert thinking.queue_for(request(think=8)) is thinking.thoughts
    assert thinking.queue_for(request()) is thinking.queue
    plain = ServedModel.of(GatedBackend(), BatchSettings(), 1)
    assert plain.queues == [plain.queue]


def test_reads_are_answered_while_a_thought_holds_its_batch() -> None:
    """One batch in flight a lane (a backend that reads no batches at once): in one queue the read would wait for
    the held thought; in its own lane it is answered while the thought is still held."""
    backend = GatedBackend(capabilities=THINKS)
    decider = Decider([backend], DeciderSettings())
    decider.load()

    async def scenario() -> None:
        decider.start()
        try:
            thought = asyncio.ensure_future(decider.decide("default", request("hold: a long thought", think=8)))
            assert await asyncio.to_thread(backend.entered.wait, 30)
            for _ in range(3):
                decision = await asyncio.wait_for(decider.decide("default", request()), 30)
                assert decision.answers["q"]["noul"] == 0.25
            assert not thought.done()
            backend.release.set()
            assert (await asyncio.wait_for(thought, 30)).answers["q"]["noul"] == 0.25
        finally:
            backend.release.set()
            await decider.stop(5.0)

    asyncio.run(scenario())
