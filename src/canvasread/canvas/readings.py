"""Label-slot reads: a batch's (job, canvas, read number) reads in one reader call, filed per question and slot.

Fetching and filing are apart, so a read fetched ahead of the round that asks
for it (`rereads.RereadPolicy.ahead`) is filed only if that round comes.

A read's canvas is the planned canvas with seeded noise at its slots
(`plan.noisy_canvas`); a multi-step read's own draws are seeded by the noisy
canvas (`canvasread.canvas.seeds`). Span questions' blanks are the span
search's reads: `fetch` only carries them beside the label reads, in one
call. The reads of a job whose caller has left are stopped where the reader
can (`canvasread.canvas.reader.read_for`) and never filed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas import seeds
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.reader import CanvasRead, Reader, Slot, SlotLogProbs, read_for
from canvasread.canvas.readout import SlotReading, slot_reading


class WantedRead(NamedTuple):
    """One read of one canvas of one job of the batch (`read` numbers the reads of that canvas from 0)."""

    job: int
    canvas: int
    read: int


class Fetched(NamedTuple):
    """What one reader call gave: the wanted label reads (a gone caller's left out), and the reads made beside them."""

    labels: dict[WantedRead, list[SlotLogProbs]]
    beside: list[list[SlotLogProbs]]


class Readings:
    """Every label slot's readings so far, per (job, question): a list per slot, a reading per read."""

    def __init__(self, jobs: Sequence[CanvasJob]) -> None:
        self._questions = [len(job.plan.questions) for job in jobs]
        self._slots: dict[tuple[int, int], list[list[SlotReading]]] = {
            (j, q): [[] for _ in planned.slots]
            for j, job in enumerate(jobs)
            for q, planned in enumerate(job.plan.questions)
        }

    def of(self, job: int, question: int) -> list[list[SlotReading]]:
        """The question's readings, slot by slot (empty lists for a question not read at slots)."""
        return self._slots[(job, question)]

    def by_question(self, job: int) -> list[list[list[SlotReading]]]:
        """The job's readings, question by question (each as `of` gives it)."""
        return [self._slots[(job, q)] for q in range(self._questions[job])]

    def add(self, job: int, question: int, slot: int, reading: SlotReading) -> None:
        self._slots[(job, question)][slot].append(reading)


class SlotReads:
    """Reads label slots through one reader, for a tokenizer's vocabulary (the noise's range)."""

    def __init__(self, reader: Reader, vocab_size: int) -> None:
        self._reader = reader
        self._vocab_size = vocab_size

    def fetch(
        self,
        jobs: Sequence[CanvasJob],
        wanted: Sequence[WantedRead],
        gone: Gone = never_gone,
        beside: Sequence[CanvasRead] = (),
    ) -> Fetched:
        """Read `wanted` and `beside` in one reader call (none when both are empty), each read's label slots in its
        canvas's order; a job whose caller is `gone` has its reads stopped where the reader can, and left out."""
        if not wanted and not beside:
            return Fetched({}, [])
        reads = [self.canvas_read(jobs[w.job], w.canvas, w.read) for w in wanted]
        results = read_for(self._reader, [*reads, *beside], lambda i: i < len(wanted) and gone(wanted[i].job))
        labels = {w: slots for w, slots in zip(wanted, results[: len(wanted)], strict=True) if not gone(w.job)}
        return Fetched(labels, results[len(wanted) :])

    @staticmethod
    def file(
        jobs: Sequence[CanvasJob],
        wanted: Sequence[WantedRead],
        fetched: Mapping[WantedRead, Sequence[SlotLogProbs]],
        readings: Readings,
        only: Collection[tuple[int, int]] | None = None,
    ) -> None:
        """File the `wanted` reads that were `fetched` (with `only`, just those (job, question)s' slots)."""
        for w in wanted:
            if w not in fetched:
                continue
            results = iter(fetched[w])
            plan = jobs[w.job].plan
            for q in plan.canvases[w.canvas].questions:
                for s, slot in enumerate(plan.questions[q].slots):
                    logprobs = next(results)
                    if only is None or (w.job, q) in only:
                        readings.add(w.job, q, s, slot_reading(*slot.split(logprobs.label_logprobs)))

    def canvas_read(self, job: CanvasJob, canvas_index: int, read: int) -> CanvasRead:
        """Read number `read` of the job's canvas: its noisy ids, its slots, its prompt, `steps` and their seed."""
        canvas = job.plan.canvases[canvas_index]
        questions = job.plan.questions
        ids = noisy_canvas(canvas, questions, vocab_size=self._vocab_size, seed=job.seed, read=read)
        slots = tuple(Slot(slot.position, slot.read_ids) for q in canvas.questions for slot in questions[q].slots)
        prompt = job.read_prompt(canvas)
        steps, seed = job.request.options.steps, seeds.derive(job.seed, read, ids)
        return CanvasRead(prompt.ids, prompt.prefix_length, ids, slots, prompt.images, steps, seed)
