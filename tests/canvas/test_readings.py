"""`SlotReads`: one reader call for a batch's reads, each read's noise and step seed derived from the request's seed,
and the readings filed per question and slot when filed, not when fetched (with `only`, just the questions read
again); reads made beside the label reads share their call."""

from __future__ import annotations

from helpers import FirstLabel, scripted_backend

from canvasread.canvas import seeds
from canvasread.canvas.plan import noisy_canvas
from canvasread.canvas.readings import Readings, SlotReads, WantedRead
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.wire import parse_request

QUESTIONS = {
    "money": {"type": "noul", "instructions": "Was the customer charged twice?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}},
}


def test_a_batch_is_read_in_one_call_and_filed_per_question(tokenizer: HFTokenizer) -> None:
    reader = FirstLabel()
    backend = scripted_backend(reader, tokenizer)
    body = {"model": "m", "state": "charged twice", "questions": QUESTIONS, "seed": 4, "steps": 2}
    job = backend.prepare(parse_request(body)[1])
    reads = SlotReads(reader, tokenizer.vocab_size)
    readings = Readings([job])
    wanted = [WantedRead(0, 0, 0), WantedRead(0, 0, 1)]
    fetched = reads.fetch([job], wanted).labels
    assert [len(readings.of(0, q)[0]) for q in (0, 1)] == [0, 0], "fetching files nothing"
    reads.file([job], wanted, fetched, readings)
    [call] = reader.calls
    assert len(call) == 2 and all(read.steps == 2 for read in call)
    for number, read in enumerate(call):
        ids = noisy_canvas(
            job.plan.canvases[0], job.plan.questions, vocab_size=tokenizer.vocab_size, seed=4, read=number
        )
        assert read.canvas_ids == ids and read.seed == seeds.derive(4, number, ids)
        assert read.prompt_ids == job.plan.prompts[0].ids
    assert [len(readings.of(0, q)[0]) for q in (0, 1)] == [2, 2]
    assert readings.of(0, 1)[0][0].probabilities[0] > 0.99
    again = [WantedRead(0, 0, 2)]
    reads.file([job], again, reads.fetch([job], again).labels, readings, only={(0, 1)})
    assert [len(readings.of(0, q)[0]) for q in (0, 1)] == [2, 3], "only the question read again files its reading"
    assert reads.fetch([job], []) == ({}, []) and len(reader.calls) == 2, "nothing wanted, no reader call"
    beside = reads.fetch([job], again, gone=lambda j: True, beside=call[:1])
    assert beside.labels == {} and len(beside.beside) == 1, "a gone caller's reads are left out, the reads beside kept"
    assert len(reader.calls) == 3 and reader.calls[-1][1:] == call[:1], "one call for both, the reads beside last"
