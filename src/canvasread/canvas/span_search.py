"""Reading span and spans questions: blank canvases, rounds of reads, and the pieces they find.

A span question has a canvas of its own (planned by `Planner`): `name:` then a
blank running to the end of the canvas. One round reads that canvas (with
`samples` reads averaged, "auto" being one) and scores the blank
(`canvasread.canvas.spans`). A `span` question is answered by its first round.
A `spans` question reads again with every piece found so far pinned on its
line, separated by `;`, and the blank after them, until the best candidate is
to stop, no piece fits in what is left of the canvas, or `MAX_PIECES` pieces
are found (the answer then says `complete: false`). The rounds of every span
question of a batch are read together, one reader call per round, against the
prompts the rest of the request is read with (so a prompt already encoded for
the other questions is reused); the first round rides the label slots' first
reader call (`BlankRound`), so the blank's first steps share the passes of the
labels' reads instead of waiting for them.

Noise follows the question's content, as for label slots: the blank of round
r of read n is drawn from a generator seeded by (request seed, n, question
digest, r), and a blank read of several steps seeds its draws by its noisy
canvas (`canvasread.canvas.seeds`). A blank is read with at least `SPAN_STEPS`
steps (the request's `steps` when more, as many as the model can): its noise
differs from read to read and round to round, so its draws do too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from canvasread.backends.base import Gone
from canvasread.canvas import seeds
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.plan import PlannedQuestion
from canvasread.canvas.prompt import EncodedPrompt
from canvasread.canvas.reader import CanvasRead, Reader, Slot, SlotLogProbs
from canvasread.canvas.spans import MIN_BLANK, SPAN_STEPS, Markers, StateTokens, mean_rows, score_blank
from canvasread.types import Distribution, Found, JSONValue, Piece

# A spans answer lists at most this many pieces: each is one more round of reads.
MAX_PIECES = 8


@dataclass
class SpanSearch:
    """One span or spans question of one request, as its rounds go: what is pinned, what was found.

    Markers with a separator list pieces (spans: a round per piece, up to `MAX_PIECES`); without one the
    search ends at the first piece (span). Every read is against `prompt`, of `steps` steps.
    """

    markers: Markers
    state: StateTokens
    canvas_ids: tuple[int, ...]
    blank_start: int
    digest: str
    seed: int
    samples: int
    prompt: EncodedPrompt
    steps: int = 1
    found: list[tuple[tuple[int, int], float]] = field(default_factory=list)
    stop_confidence: float | None = None
    complete: bool = True
    rounds: list[dict[str, JSONValue]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.stop_confidence is not None or not self.complete or (not self.listed and bool(self.found))

    @property
    def listed(self) -> bool:
        return self.markers.separator is not None

    def pinned(self) -> list[int]:
        """The line so far: `name:`, then each piece found, in the order found, separated by `;`."""
        ids = list(self.canvas_ids[: self.blank_start])
        for index, ((i, j), _) in enumerate(self.found):
            if index and self.markers.separator is not None:
                ids.append(self.markers.separator)
            ids += self.state.ids[i:j]
        return ids

    def reads(self, vocab_size: int) -> list[CanvasRead]:
        """This round's reads; none (and `complete` false) when what is left of the canvas holds no piece."""
        pinned = self.pinned()
        width = len(self.canvas_ids)
        if width - len(pinned) < MIN_BLANK:
            self.complete = False
            return []
        wanted = tuple(sorted({*self.state.distinct_ids, self.markers.stop, *self.markers.ends}))
        slots = tuple(Slot(position, wanted) for position in range(len(pinned), width))
        reads = []
        for read in range(self.samples):
            rng = seeds.noise(self.seed, read, self.digest, f"round{len(self.rounds)}")
            ids = tuple(pinned) + tuple(rng.randrange(vocab_size) for _ in slots)
            step_seed = seeds.derive(self.seed, 0, ids)
            prompt = self.prompt
            reads.append(CanvasRead(prompt.ids, prompt.prefix_length, ids, slots, prompt.images, self.steps, step_seed))
        return reads

    def record(self, results: Sequence[Sequence[SlotLogProbs]], slots: tuple[Slot, ...]) -> None:
        """Score this round's blank from its reads and file the piece, or the stop."""
        per_read = [
            [dict(zip(slot.label_ids, got.label_logprobs, strict=True)) for slot, got in zip(slots, read, strict=True)]
            for read in results
        ]
        continues = bool(self.found)
        taken = [r for r, _ in self.found]
        scores = score_blank(self.state, mean_rows(per_read), self.markers, continues=continues, taken=taken)
        self.rounds.append({"mass": scores.mass, "candidates": scores.candidates, "confidence": scores.confidence})
        if scores.best is None:
            self.stop_confidence = scores.confidence
        else:
            self.found.append((scores.best, scores.confidence))
            if len(self.found) >= MAX_PIECES and self.listed:
                self.complete = False

    def distribution(self, details: dict[str, JSONValue]) -> Distribution:
        pieces = []
        for (i, j), confidence in self.found:
            text, start, end = self.state.piece(i, j)
            pieces.append(Piece(text, start, end, confidence))
        decisions = [confidence for _, confidence in self.found]
        decisions += [self.stop_confidence] if self.stop_confidence is not None else []
        found = Found(tuple(sorted(pieces, key=lambda p: (p.start, p.end))), min(decisions, default=0.0), self.complete)
        reads = self.samples * len(self.rounds)
        details = {**details, "blank": {"start": self.blank_start, "width": len(self.canvas_ids)}}
        details |= {"rounds": list(self.rounds), "reads": reads}
        return Distribution((), details, reads=reads, found=found)


class BlankRound:
    """One round of the searches still going: their reads, for one reader call (beside other reads where the caller
    has some), and the recording of what came back. A search with nothing left to read is done once this is built."""

    def __init__(self, searches: Sequence[SpanSearch], vocab_size: int) -> None:
        planned = [(search, search.reads(vocab_size)) for search in searches if not search.done]
        self._planned = [(search, reads) for search, reads in planned if reads]
        self.reads: list[CanvasRead] = [read for _, reads in self._planned for read in reads]

    def record(self, results: Sequence[Sequence[SlotLogProbs]]) -> None:
        """File each search's share of `results` (in the order of `reads`)."""
        cursor = 0
        for search, reads in self._planned:
            search.record(results[cursor : cursor + len(reads)], reads[0].slots)
            cursor += len(reads)


def search_all(searches: Sequence[SpanSearch], reader: Reader, vocab_size: int) -> None:
    """Run every search's rounds to the end, all searches' reads of a round in one reader call."""
    while any(not search.done for search in searches):
        blanks = BlankRound(searches, vocab_size)
        if blanks.reads:
            blanks.record(reader.read(blanks.reads))


class SpanSearcher:
    """The span searches of a batch, for one loaded runtime: which questions are read at a blank, and how.

    Built once per runtime from what does not change per read: the reader, its vocabulary, the blank markers of
    each kind read at a blank (`Kind.blank`), the model's most steps and the reader's multi-step label-id limit.
    """

    def __init__(
        self,
        reader: Reader,
        vocab_size: int,
        markers: Mapping[str, Markers],
        max_steps: int,
        step_label_ids: int | None = None,
    ) -> None:
        self._reader = reader
        self._vocab_size = vocab_size
        self._markers = dict(markers)
        self._max_steps = max_steps
        self._step_label_ids = step_label_ids

    def begin(self, jobs: Sequence[CanvasJob], gone: Gone) -> list[dict[int, SpanSearch]]:
        """Every span question of the batch whose caller still waits, before its first round; per job, by question."""
        found: list[dict[int, SpanSearch]] = []
        for j, job in enumerate(jobs):
            asked = () if gone(j) else job.plan.questions
            searches = (self.start(job, planned) for planned in asked)
            found.append({q: search for q, search in enumerate(searches) if search is not None})
        return found

    def first_round(self, found: Sequence[dict[int, SpanSearch]]) -> BlankRound:
        """The first round of the searches `begin` found, to be read beside the label slots' first reads."""
        return BlankRound(_every(found), self._vocab_size)

    def finish(self, found: Sequence[dict[int, SpanSearch]]) -> None:
        """Every search's remaining rounds, to the end."""
        search_all(_every(found), self._reader, self._vocab_size)

    def start(self, job: CanvasJob, planned: PlannedQuestion) -> SpanSearch | None:
        """The question's search before its first round (None: it is not read at a blank)."""
        markers = self._markers.get(planned.question.kind)
        if markers is None or job.state is None:
            return None
        canvas = job.plan.canvases[planned.canvas]
        blank = (canvas.ids, planned.position, planned.digest)  # where the blank is, and what seeds its noise
        prompt = job.read_prompt(canvas)
        return SpanSearch(markers, job.state, *blank, job.seed, job.first_reads, prompt, self.steps(job, job.state))

    def steps(self, job: CanvasJob, state: StateTokens) -> int:
        """A blank's steps: at least `SPAN_STEPS` (the request's when more), at most the model's; one past the
        reader's multi-step limit, since a blank asks the state's distinct ids and at most two markers."""
        limit = self._step_label_ids
        if limit is not None and len(state.distinct_ids) + 2 > limit:
            return 1
        return min(max(job.request.options.steps, SPAN_STEPS), self._max_steps)


def _every(found: Sequence[dict[int, SpanSearch]]) -> list[SpanSearch]:
    """The searches `SpanSearcher.begin` found, every job's, in one list."""
    return [search for searches in found for search in searches.values()]
