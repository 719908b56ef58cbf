"""What goes into the next pass: a token budget shared by prompt encodings, reads and thoughts, taken in turns.

The engine hands the scheduler one queue of units per prompt in flight, the
oldest prompt first: the prompt's encoding rows not yet run, then the next
step of each task that reads it (a read, a multi-step read's next step, a
thought's next block encoding and denoising step). A queue's units depend on
the ones before them (a canvas reads the keys its prompt's rows write, which
a pass writes before any attention reads them), so they are taken in order.

The pass takes one unit from each queue in turn, oldest first, until its
token budget or its rows run out; a queue whose next unit does not fit is
done for this pass. So no one prompt (a request's many canvases, a long
thought) fills a pass while another waits, work already under way goes
before new work, and a prompt's reads share the pass that encodes it when
there is room (vLLM's chunked prefill, with the oldest first).

Thoughts are background work: their queues (`background`) fill what the
reads leave of the budget, and the engine lets only the oldest thought's
queue take its step while reads are coming (`background_queues=1`). A pass
costs a floor (streaming the active weights) plus its tokens, and cannot be
cut short: every thought canvas in a pass (a whole 256-token block)
lengthens the pass that a read waits on, or waits behind when it arrives
mid-pass. On the H200 eight thoughts beside eight reading clients tripled
the readers' p95. Once no read has come for a while (`EngineCore.hold`),
every thought steps.

Even one thought's step in every reading pass, with its draw after, took
the readers' p95 up 39% on the H200. So in passes that read, thoughts get a
`Share` of the engine's time, as a CPU scheduler gives a niced process its
share: a thought steps beside reads only while the time thoughts took so
far is within that fraction of the time both took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

UnitT = TypeVar("UnitT")


@dataclass(frozen=True)
class Sized(Generic[UnitT]):
    """A unit of work and the tokens it puts in a pass."""

    unit: UnitT
    tokens: int


class Share:
    """The fraction of the engine's time that background work may take while reads are coming.

    Counted over the passes where both were waiting (`spent`), and forgotten
    when they were not: time alone is no credit or debt for later.
    """

    def __init__(self, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("a share is a fraction between 0 and 1")
        self.fraction = fraction
        self._reads = 0.0
        self._background = 0.0

    def allows(self) -> bool:
        """Whether background work may take a step in a pass that reads (never, with a share of 0)."""
        return self.fraction > 0 and self._background <= self.fraction * (self._reads + self._background)

    def spent(self, *, reads: float, background: float) -> None:
        """Seconds of a pass where both waited: what the reads took, and what background work took."""
        self._reads += reads
        self._background += background

    def forget(self) -> None:
        self._reads = self._background = 0.0


def pack(
    queues: Sequence[Sequence[Sized[UnitT]]],
    *,
    budget: int,
    max_rows: int,
    background: Sequence[Sequence[Sized[UnitT]]] = (),
    background_queues: int | None = None,
) -> list[UnitT]:
    """The units of the next pass, in the order taken: `queues` in turns, then what they leave to the first
    `background_queues` of the `background` queues that have work (None: all of them)."""
    taken, budget = _turns(queues, budget, max_rows)
    stepping = [queue for queue in background if queue][:background_queues]
    more, _ = _turns(stepping, budget, max_rows - len(taken))
    return taken + more


def _turns(queues: Sequence[Sequence[Sized[UnitT]]], budget: int, max_rows: int) -> tuple[list[UnitT], int]:
    """One unit from each queue in turn, oldest first, within the budget and rows; and the budget left."""
    taken: list[UnitT] = []
    taken_from = [0] * len(queues)
    open_queues = [q for q, queue in enumerate(queues) if queue]
    while open_queues and len(taken) < max_rows:
        still_open = []
        for q in open_queues:
            if len(taken) == max_rows:
                break
            sized = queues[q][taken_from[q]]
            if sized.tokens > budget:
                continue
            taken.append(sized.unit)
            budget -= sized.tokens
            taken_from[q] += 1
            if taken_from[q] < len(queues[q]):
                still_open.append(q)
        open_queues = still_open
    return taken, budget
