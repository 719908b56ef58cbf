"""`CanvasBackend` on a tiny checkpoint: a job whose caller has left gets no more re-read rounds."""

from __future__ import annotations

from helpers import canvas_backend

from canvasread.decide import Decider
from canvasread.wire import parse_request

QUESTIONS = {f"q{i}": {"type": "noul", "instructions": f"Is statement {i} true?"} for i in range(6)}


def test_re_reads_stop_for_a_job_whose_caller_has_left(tiny_decider: Decider) -> None:
    backend = canvas_backend(tiny_decider)
    body = {"model": "m", "state": "charged twice", "questions": QUESTIONS, "seed": 2, "samples": "auto"}
    before = backend.counters()["rereads"]
    [waited] = backend.decide([backend.prepare(parse_request(body)[1])])
    rereads = backend.counters()["rereads"] - before
    assert waited is not None and rereads > 0, "the random tiny model is unsure: auto re-reads some questions"
    [left] = backend.decide([backend.prepare(parse_request(body)[1])], lambda index: True)
    assert left is None and backend.counters()["rereads"] - before == rereads, "no re-read for a caller gone"
