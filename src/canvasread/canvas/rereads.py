"""The re-read policy: which canvases a batch reads first, and which it reads again.

Every canvas of every job is read `samples` times at first (once for
`samples: "auto"`), all in one reader call. Then, for "auto" jobs whose caller
still waits, a question whose averaged label distribution is still uncertain
(`readout.needs_another_read`, judged on the slots its kind is judged by) is
read again with fresh noise, a round at a time, until none is or the reads
reach `max_reads`. A round re-reads a canvas once for all its uncertain
questions, and files the new readings of those questions only.

A batch may read its re-reads ahead, in its first reader call (`ahead`), as
far as the room it is given: a pass's cost is mostly the weights it streams,
so a few more canvas rows beside the first reads cost a fraction of the
passes the rounds would take. The rounds then take those readings instead of
reading again, so the answers are the ones the rounds alone give (each read's
noise is seeded by its read number, not by when it is read); a read ahead
that no round asks for is left unfiled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from canvasread.backends.base import Gone
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.readings import Readings, WantedRead
from canvasread.canvas.readout import needs_another_read
from canvasread.kinds import kind_of

# (job, question) pairs of a batch.
Asked = set[tuple[int, int]]


@dataclass(frozen=True)
class RereadPolicy:
    """Re-read while a question's normalised label entropy is above `entropy` (1 = uniform), at most `max_reads`."""

    entropy: float
    max_reads: int

    @staticmethod
    def first(jobs: Sequence[CanvasJob]) -> list[WantedRead]:
        """The first reads: each label canvas of each job, `first_reads` times (blanks are the span search's)."""
        return [
            WantedRead(j, c, r)
            for j, job in enumerate(jobs)
            for r in range(job.first_reads)
            for c in job.label_canvases
        ]

    def ahead(self, jobs: Sequence[CanvasJob], room: int) -> list[WantedRead]:
        """The re-reads to read with the first reads (the module docstring): each "auto" label canvas's later
        reads, in the order the rounds would ask for them, while their canvas tokens fit in `room`."""
        later = [
            WantedRead(j, c, read)
            for read in self.rounds()
            for j, job in enumerate(jobs)
            if job.request.options.samples == "auto"
            for c in job.label_canvases
        ]
        totals = accumulate(_width(jobs, wanted) for wanted in later)
        return [wanted for wanted, total in zip(later, totals, strict=True) if total <= room]

    def rounds(self) -> Iterator[int]:
        """The read numbers re-read rounds may use: 1 up to `max_reads - 1`."""
        return iter(range(1, self.max_reads))

    def uncertain(self, jobs: Sequence[CanvasJob], readings: Readings, gone: Gone) -> Asked:
        """The "auto" questions of waiting callers that need another read, per the module docstring."""
        return {
            (j, q)
            for j, job in enumerate(jobs)
            if job.request.options.samples == "auto" and not gone(j)
            for q, planned in enumerate(job.plan.questions)
            if (kind := kind_of(planned.question.kind)).blank is None
            and any(
                needs_another_read(readings.of(j, q)[s], entropy_threshold=self.entropy, max_reads=self.max_reads)
                for s in kind.judged_slots
            )
        }

    @staticmethod
    def tokens(jobs: Sequence[CanvasJob], reads: Sequence[WantedRead]) -> int:
        """The canvas tokens of `reads`: the room they take."""
        return sum(_width(jobs, wanted) for wanted in reads)

    @staticmethod
    def again(jobs: Sequence[CanvasJob], uncertain: Asked, read: int) -> list[WantedRead]:
        """Round `read`'s reads: each canvas holding an uncertain question, once."""
        return [
            WantedRead(j, c, read) for j, c in sorted({(j, jobs[j].plan.questions[q].canvas) for j, q in uncertain})
        ]


def _width(jobs: Sequence[CanvasJob], wanted: WantedRead) -> int:
    """The canvas tokens one read takes."""
    return len(jobs[wanted.job].plan.canvases[wanted.canvas].ids)
