"""`RereadPolicy`: every label canvas is read `samples` times at first; an "auto" question is read again while its
judged slots are uncertain, up to the cap, and never for a caller who has gone; a round reads a canvas once."""

from __future__ import annotations

from typing import Any

from helpers import FirstLabel, scripted_backend

from canvasread.canvas.job import CanvasJob
from canvasread.canvas.readings import Readings, WantedRead
from canvasread.canvas.readout import SlotReading
from canvasread.canvas.rereads import RereadPolicy
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.wire import parse_request

NOUL = {"type": "noul", "instructions": "Was the customer charged twice?"}
ALONE = {"type": "noul", "instructions": "Is it urgent?", "alone": True}
SPAN = {"type": "span", "instructions": "Which order?"}
POLICY = RereadPolicy(entropy=0.5, max_reads=3)
SURE, UNSURE = SlotReading((0.99, 0.01), 1.0), SlotReading((0.5, 0.5), 1.0)


def jobs(tokenizer: HFTokenizer, *bodies: dict[str, Any]) -> list[CanvasJob]:
    backend = scripted_backend(FirstLabel(), tokenizer)
    base = {"model": "m", "state": "charged twice for order 1182"}
    return [backend.prepare(parse_request({**base, **body})[1]) for body in bodies]


def test_the_first_reads_are_each_label_canvas_samples_times_and_never_a_blank(tokenizer: HFTokenizer) -> None:
    batch = jobs(tokenizer, {"questions": {"a": NOUL, "b": ALONE, "c": SPAN}, "samples": 2}, {"questions": {"a": NOUL}})
    assert [batch[0].is_blank(canvas) for canvas in batch[0].plan.canvases] == [False, False, True]
    assert batch[0].label_canvases == [0, 1]
    expected = [WantedRead(0, c, r) for r in range(2) for c in (0, 1)] + [WantedRead(1, 0, 0)]
    assert POLICY.first(batch) == expected
    assert list(POLICY.rounds()) == [1, 2]


def test_only_uncertain_auto_questions_of_waiting_callers_are_read_again(tokenizer: HFTokenizer) -> None:
    batch = jobs(tokenizer, {"questions": {"a": NOUL, "b": ALONE}}, {"questions": {"a": NOUL}, "samples": 1})
    readings = Readings(batch)
    for j, q, reading in [(0, 0, SURE), (0, 1, UNSURE), (1, 0, UNSURE)]:
        readings.add(j, q, 0, reading)
    assert POLICY.uncertain(batch, readings, lambda j: False) == {(0, 1)}, "a fixed sample count never re-reads"
    assert POLICY.uncertain(batch, readings, lambda j: True) == set(), "nor does a caller who has gone"
    assert POLICY.again(batch, {(0, 1)}, 1) == [WantedRead(0, 1, 1)]
    readings.add(0, 1, 0, UNSURE)
    readings.add(0, 1, 0, UNSURE)
    assert POLICY.uncertain(batch, readings, lambda j: False) == set(), "three reads are the cap"


def test_a_round_reads_a_canvas_once_for_all_its_uncertain_questions(tokenizer: HFTokenizer) -> None:
    [job] = jobs(tokenizer, {"questions": {"a": NOUL, "b": {**NOUL, "instructions": "Was it refunded?"}}})
    assert len(job.plan.canvases) == 1
    assert POLICY.again([job], {(0, 0), (0, 1)}, 2) == [WantedRead(0, 0, 2)]


def test_reads_ahead_are_the_rounds_reads_in_their_order_within_the_room(tokenizer: HFTokenizer) -> None:
    batch = jobs(tokenizer, {"questions": {"a": NOUL, "b": ALONE, "c": SPAN}}, {"questions": {"a": NOUL}, "samples": 1})
    widths = [len(canvas.ids) for canvas in batch[0].plan.canvases]
    every = [WantedRead(0, c, r) for r in (1, 2) for c in (0, 1)]
    assert POLICY.ahead(batch, room=sum(widths[:2]) * 2) == every, (
        "each later read of each auto label canvas, read by read; never a blank, never a fixed sample count"
    )
    assert POLICY.ahead(batch, room=sum(widths[:2]) + widths[0]) == every[:3]
    assert POLICY.tokens(batch, every[:3]) == sum(widths[:2]) + widths[0]
    assert POLICY.ahead(batch, room=widths[0] - 1) == [], "nothing past the room"
    assert RereadPolicy(0.5, 1).ahead(batch, room=10_000) == [], "one read at most: no re-reads"
