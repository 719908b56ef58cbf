"""Span search rounds: a spans question pins each piece found on its line and reads on until the model stops,
the canvas is full or the cap is reached; a span question reads once. The reader here is scripted (it writes a
fixed list), so the round logic is checked on its own; the model path is checked in tests/canvas/engine."""

from __future__ import annotations

import math
from collections.abc import Sequence

from canvasread.canvas.job import CanvasJob
from canvasread.canvas.plan import Layout, ReadPlan
from canvasread.canvas.prompt import EncodedPrompt
from canvasread.canvas.reader import CanvasRead, Slot, SlotLogProbs
from canvasread.canvas.span_search import MAX_PIECES, SpanSearch, SpanSearcher, search_all
from canvasread.canvas.spans import SPAN_STEPS, Markers, StateTokens
from canvasread.types import DecisionRequest, RequestOptions

STOP, SEP = 1000, 1001
NAME = (7, 8)  # `name:`
SPANS = Markers(stop=STOP, ends=(SEP, STOP), separator=SEP)
SPAN = Markers(stop=STOP, ends=(STOP,))
PROMPT = EncodedPrompt((1, 2, 3), 0)
# "Ann met Bob and Cy": one token per word.
STATE = StateTokens("Ann met Bob and Cy", (21, 22, 23, 24, 25), ((0, 3), (3, 7), (7, 11), (11, 15), (15, 18)))


class ListWriter:
    """Writes `answer` (token ids, markers included) after `name:`: each blank position favours what comes next."""

    def __init__(self, answer: Sequence[int]) -> None:
        self.answer = list(answer)
        self.calls: list[list[CanvasRead]] = []

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        self.calls.append(list(reads))
        return [[self._slot(read, slot) for slot in read.slots] for read in reads]

    def _slot(self, read: CanvasRead, slot: Slot) -> SlotLogProbs:
        index = slot.position - len(NAME)
        wanted = self.answer[index] if index < len(self.answer) else None
        scores = [6.0 if token == wanted else 0.0 for token in slot.label_ids]
        norm = math.log(sum(math.exp(s) for s in scores) + 20.0)
        return SlotLogProbs(tuple(s - norm for s in scores))


def search(reader: ListWriter, markers: Markers, width: int = 16, samples: int = 1) -> SpanSearch:
    canvas = NAME + (0,) * (width - len(NAME))
    found = SpanSearch(markers, STATE, canvas, len(NAME), "digest", 5, samples, PROMPT)
    search_all([found], reader, vocab_size=2000)
    return found


def test_spans_pin_each_piece_and_read_until_the_model_stops() -> None:
    reader = ListWriter([23, SEP, 21, SEP, 25, STOP])  # "Bob; Ann; Cy"
    found = search(reader, SPANS).distribution({})
    assert found.found is not None and found.found.complete
    assert [(p.text, p.start, p.end) for p in found.found.pieces] == [("Ann", 0, 3), ("Bob", 8, 11), ("Cy", 16, 18)]
    assert len(reader.calls) == 4  # three pieces, then the stop
    last = reader.calls[-1][0]
    assert last.canvas_ids[: len(NAME) + 5] == (*NAME, 23, SEP, 21, SEP, 25)  # the pieces pinned in the order found
    assert [slot.position for slot in last.slots] == list(range(len(NAME) + 5, 16))
    rounds = found.details["rounds"]
    assert isinstance(rounds, list) and found.found.confidence == min(r["confidence"] for r in rounds)  # type: ignore[index]
    assert found.reads == 4 and len(rounds) == 4


def test_a_span_reads_once_and_an_empty_line_is_not_found() -> None:
    reader = ListWriter([23, 24, STOP])
    found = search(reader, SPAN).distribution({})
    assert found.found is not None and [(p.text, p.start, p.end) for p in found.found.pieces] == [("Bob and", 8, 15)]
    assert len(reader.calls) == 1
    nothing = search(ListWriter([STOP]), SPAN).distribution({})
    assert nothing.found is not None and nothing.found.pieces == () and nothing.found.confidence > 0.5


def test_the_search_ends_incomplete_when_the_canvas_is_full_or_the_cap_is_reached() -> None:
    full = search(ListWriter([23, SEP, 21, SEP, 25, STOP]), SPANS, width=5).distribution({})
    assert full.found is not None and not full.found.complete
    assert [p.text for p in full.found.pieces] == [
        "Bob"
    ]  # the blank after `Bob` leaves no room for `;`, a piece, an end
    many = StateTokens("abcdefghijkl", tuple(range(100, 112)), tuple((i, i + 1) for i in range(12)))
    answer = [token for t in many.ids for token in (t, SEP)]
    reader = ListWriter(answer)
    canvas = NAME + (0,) * 60
    capped = SpanSearch(SPANS, many, canvas, len(NAME), "d", 1, 1, PROMPT)
    search_all([capped], reader, vocab_size=2000)
    result = capped.distribution({}).found
    assert result is not None and len(result.pieces) == MAX_PIECES and not result.complete


def test_samples_are_read_with_fresh_noise_and_averaged() -> None:
    reader = ListWriter([23, STOP])
    found = search(reader, SPAN, samples=3).distribution({})
    [reads] = reader.calls
    assert len(reads) == 3 and len({read.canvas_ids for read in reads}) == 3
    assert found.reads == 3 and found.found is not None and found.found.pieces[0].text == "Bob"


def test_a_round_reads_every_search_of_the_batch_in_one_reader_call() -> None:
    reader = ListWriter([23, SEP, 21, STOP])
    canvas = NAME + (0,) * 14
    one = SpanSearch(SPAN, STATE, canvas, len(NAME), "a", 5, 1, PROMPT)
    every = SpanSearch(SPANS, STATE, canvas, len(NAME), "b", 5, 1, PROMPT)
    search_all([one, every], reader, vocab_size=2000)
    assert [len(call) for call in reader.calls] == [2, 1, 1]  # both, then the spans rounds alone
    assert [p.text for p in every.distribution({}).found.pieces] == ["Ann", "Bob"]  # type: ignore[union-attr]


def test_a_blank_takes_at_least_the_span_steps_at_most_the_models_and_one_past_the_readers_limit() -> None:
    def job_steps(steps: int, max_steps: int, limit: int | None = None) -> int:
        searcher = SpanSearcher(ListWriter([]), 2000, {"span": SPAN}, max_steps, limit)
        request = DecisionRequest("s", (), options=RequestOptions(steps=steps))
        job = CanvasJob(request, ReadPlan((), Layout((), (), ())), 0)
        return searcher.steps(job, STATE)

    assert job_steps(1, 8) == SPAN_STEPS and job_steps(6, 8) == 6 and job_steps(6, 4) == 4
    distinct = len(STATE.distinct_ids)
    assert job_steps(6, 8, limit=distinct + 2) == 6 and job_steps(6, 8, limit=distinct + 1) == 1
