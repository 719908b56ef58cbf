"""`CanvasBackend`: a job whose caller has left gets no more re-read rounds; a batch reads its re-reads ahead, in
its first reader call, and answers as the rounds alone do; the batches being read share one room for reads ahead;
a span question's first round is read in the label reads' first call."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from helpers import FirstLabel, RecordingReader, canvas_backend, loaded_runtime, scripted_backend

from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.reader import CanvasRead, Reader, SlotLogProbs
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.decide import Decider
from canvasread.wire import parse_request

QUESTIONS = {f"q{i}": {"type": "noul", "instructions": f"Is statement {i} true?"} for i in range(6)}
BODY = {"model": "m", "state": "charged twice", "questions": QUESTIONS, "seed": 2, "samples": "auto"}


class Unsure:
    """Every label equally likely: an "auto" question always reads again."""

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        even = [[(-math.log(len(slot.label_ids)),) * len(slot.label_ids) for slot in read.slots] for read in reads]
        return [[SlotLogProbs(logprobs) for logprobs in slots] for slots in even]


class Gated(RecordingReader):
    """A recording reader whose first call waits until a second comes, so both are in flight at once."""

    def __init__(self, reader: Reader) -> None:
        super().__init__(reader)
        self._second = threading.Event()

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        call = self.recorded(reads)
        if call == 1:
            assert self._second.wait(30), "no second call came while the first was in flight"
        elif call == 2:
            self._second.set()
        return self.inner.read(reads)


def test_re_reads_stop_for_a_job_whose_caller_has_left(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    before = backend.counters()["rereads"]
    [waited] = backend.decide([backend.prepare(parse_request(BODY)[1])])
    rereads = backend.counters()["rereads"] - before
    assert waited is not None and rereads > 0, "the random tiny model is unsure: auto re-reads some questions"
    [left] = backend.decide([backend.prepare(parse_request(BODY)[1])], lambda index: True)
    assert left is None and backend.counters()["rereads"] - before == rereads, "no re-read for a caller gone"


def test_a_batch_reads_ahead_and_answers_as_the_rounds_alone_do(tiny_decider: Decider) -> None:
    runtime = loaded_runtime(canvas_backend(tiny_decider))
    sizes = {"canvas_length": runtime.canvas_length, "max_positions": runtime.max_positions}
    answers, calls = [], []
    for ahead in (0, 4096):
        reader = RecordingReader(runtime.reader)
        backend = scripted_backend(reader, runtime.tokenizer, settings=ReadSettings(read_ahead_tokens=ahead), **sizes)
        [result] = backend.decide([backend.prepare(parse_request(BODY)[1])])
        assert result is not None
        answers.append(result.distributions)
        calls.append([len(call) for call in reader.calls])
    rounds, ahead = calls
    assert len(rounds) == 4 and len(ahead) == 1, "the random tiny model stays unsure: three rounds, or none"
    assert ahead[0] == sum(rounds), "the one call held every read the rounds made"
    for alone, read_ahead in zip(*answers, strict=True):
        assert alone.reads == read_ahead.reads
        assert all(
            math.isclose(a, b, abs_tol=1e-6) for a, b in zip(alone.probabilities, read_ahead.probabilities, strict=True)
        )


def test_reads_ahead_no_round_asks_for_are_counted_and_never_filed(tokenizer: HFTokenizer) -> None:
    reader = FirstLabel()  # every question sure at its first read
    backend = scripted_backend(reader, tokenizer)
    [result] = backend.decide([backend.prepare(parse_request(BODY)[1])])
    assert result is not None and all(d.reads == 1 for d in result.distributions)
    [call] = reader.calls
    counters = backend.counters()
    assert counters["reads_ahead"] == counters["reads_ahead_unused"] == len(call) * 3 / 4 > 0
    assert counters["rereads"] == 0


def test_the_batches_being_read_share_one_room_for_reads_ahead(tokenizer: HFTokenizer) -> None:
    reader = Gated(Unsure())
    probe = scripted_backend(FirstLabel(), tokenizer).prepare(parse_request(BODY)[1])
    room = 3 * sum(len(canvas.ids) for canvas in probe.plan.canvases)  # one batch's three re-reads
    backend = scripted_backend(reader, tokenizer, settings=ReadSettings(read_ahead_tokens=room))
    first = threading.Thread(target=backend.decide, args=([backend.prepare(parse_request(BODY)[1])],))
    first.start()
    [beside] = backend.decide([backend.prepare(parse_request(BODY)[1])])
    first.join(30)
    assert beside is not None and all(d.reads == 4 for d in beside.distributions)
    sizes = [len(call) for call in reader.calls]
    [first_call, canvases] = sizes[:2]
    assert first_call == 4 * canvases, "the first batch took the room: its three re-reads ahead"
    assert sorted(sizes[2:]) == [canvases] * 3, "the batch beside it found none left: its rounds one by one"
    backend.decide([backend.prepare(parse_request(BODY)[1])])
    assert len(reader.calls[-1]) == 4 * canvases, "the room is given back when a batch's first call ends"


def test_a_blanks_first_round_is_read_in_the_label_reads_first_call(tokenizer: HFTokenizer) -> None:
    reader = FirstLabel()
    backend = scripted_backend(reader, tokenizer)
    body = {**BODY, "questions": {"money": QUESTIONS["q0"], "signed": {"type": "span", "instructions": "Which?"}}}
    [result] = backend.decide([backend.prepare(parse_request(body)[1])])
    assert result is not None and result.distributions[1].found is not None
    widths = [{len(slot.label_ids) for read in call for slot in read.slots} for call in reader.calls]
    assert len(widths) == 1 and 2 in widths[0] and max(widths[0]) > 2, (
        "one call: the noul slot's two labels and the blank's slots, which offer the state's tokens"
    )
