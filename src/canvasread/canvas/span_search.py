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
the other questions is reused).

Noise follows the question's content, as for label slots: blank position k of
round r of read n is drawn from a generator seeded by (request seed, n,
question digest, r).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from canvasread.canvas.reader import CanvasRead, Reader, Slot, SlotLogProbs
from canvasread.canvas.spans import MIN_BLANK, Markers, StateTokens, mean_rows, score_blank
from canvasread.types import Distribution, Found, JSONValue, Piece

# A spans answer lists at most this many pieces: each is one more round of reads.
MAX_PIECES = 8


@dataclass
class SpanSearch:
    """One span or spans question of one request, as its rounds go: what is pinned, what was found.

    Markers with a separator list pieces (spans: a round per piece, up to `MAX_PIECES`); without one the
    search ends at the first piece (span).
    """

    markers: Markers
    state: StateTokens
    canvas_ids: tuple[int, ...]
    blank_start: int
    digest: str
    seed: int
    samples: int
    read: Callable[[tuple[int, ...], tuple[Slot, ...]], CanvasRead]
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
            material = f"{self.seed}|{read}|{self.digest}|round{len(self.rounds)}"
            rng = random.Random(int.from_bytes(hashlib.sha256(material.encode()).digest()[:8], "big"))
            reads.append(self.read(tuple(pinned) + tuple(rng.randrange(vocab_size) for _ in slots), slots))
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


def search_all(searches: Sequence[SpanSearch], reader: Reader, vocab_size: int) -> None:
    """Run every search's rounds to the end, all searches' reads of a round in one reader call."""
    active = [search for search in searches if not search.done]
    while active:
        planned = [(search, search.reads(vocab_size)) for search in active]
        planned = [(search, reads) for search, reads in planned if reads]
        results = reader.read([read for _, reads in planned for read in reads]) if planned else []
        cursor = 0
        for search, reads in planned:
            search.record(results[cursor : cursor + len(reads)], reads[0].slots)
            cursor += len(reads)
        active = [search for search in active if not search.done]
