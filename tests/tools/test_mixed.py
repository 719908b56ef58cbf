"""The mixed workload: what it promises about its requests, checked over many of them."""

from __future__ import annotations

from canvasread.tools.mixed import QUESTION_SETS, mixed_body, question_set
from canvasread.tools.workloads import WORKLOADS
from canvasread.wire import parse_request


def test_requests_draw_every_shape_the_workload_promises() -> None:
    bodies = [mixed_body(n) for n in range(400)]
    for body in bodies:
        parse_request(body)  # every request is valid on the wire
        assert "samples" not in body  # default options
    words = [len(body["state"].split()) for body in bodies]
    assert min(words) < 30 and max(words) > 1_000  # log-uniform, about 20 to 2,000 tokens
    questions = [q for index in range(QUESTION_SETS) for q in question_set(index).values()]
    assert {q["type"] for q in questions} == {"noul", "choice", "score"}
    sizes = [len(q["criteria"]) for q in questions if q["type"] == "choice"]
    assert min(sizes) >= 2 and max(sizes) <= 40 and max(sizes) > 20
    assert all(1 <= len(question_set(i)) <= 12 for i in range(QUESTION_SETS))
    assert len({tuple(body["questions"]) for body in bodies}) == QUESTION_SETS


def test_the_same_sequence_is_the_same_request_and_samples1_reads_once() -> None:
    assert mixed_body(7) == mixed_body(7) != mixed_body(8)
    assert WORKLOADS["mixed-samples1"](7, "m") == {**mixed_body(7, "m"), "samples": 1}
