"""`Diagnostics`: a question's distribution read out by its kind from its slots' readings, with where it was read,
its labels, mass, entropy, reads, spread and steps; a box reports its digits' positions and judged entropy."""

from __future__ import annotations

import pytest
from helpers import FirstLabel, scripted_backend

from canvasread.canvas.diagnostics import Diagnostics
from canvasread.canvas.readout import SlotReading
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.wire import parse_request

QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}},
    "where": {"type": "box", "instructions": "Where is the cat?"},
}


def test_each_question_reports_how_it_was_read(tokenizer: HFTokenizer) -> None:
    backend = scripted_backend(FirstLabel(), tokenizer)
    job = backend.prepare(parse_request({"model": "m", "state": "a cat", "questions": QUESTIONS, "steps": 2})[1])
    team, where = job.plan.questions
    choice = [[SlotReading((0.8, 0.2), 0.9), SlotReading((0.6, 0.4), 0.7)]]
    digits = [
        [SlotReading(tuple(1.0 if d == i % 10 else 0.0 for d in range(10)), 1.0)] for i in range(len(where.slots))
    ]
    result = Diagnostics("default", tokenizer).result(job, [choice, digits], {}, 12.0)
    first, box = result.distributions
    assert first.probabilities == pytest.approx((0.7, 0.3)) and first.reads == 2
    width = len(job.plan.canvases[team.canvas].ids)
    assert first.details["slot"] == {"canvas": team.canvas, "position": team.position, "width": width}
    assert first.details["labels"] == dict(zip(("billing", "tech"), team.labels, strict=True))
    assert first.details["label_mass"] == pytest.approx(0.8) and first.details["steps"] == 2
    assert first.details["layout"] == "default" and first.details["batch_ms"] == 12.0
    assert first.details["stderr"] == pytest.approx({"billing": 0.1, "tech": 0.1}) and first.details["agreement"] == 1
    slot = box.details["slot"]
    assert isinstance(slot, dict) and slot["positions"] == [s.position for s in where.slots]
    assert box.details["entropy"] == 0.0 and box.details["reads"] == 1 and "labels" not in box.details
    assert result.usage.input_tokens == job.plan.prompt_tokens
