"""What `depends_on` may write into a request (issue 28): each answer once per dependent, counted before it is
written, and refused with a 413 naming `--max-body-bytes` past what a body may hold."""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from canvasread.backends.base import FunctionBackend
from canvasread.decide import Decider, DeciderSettings
from canvasread.errors import PayloadTooLarge
from canvasread.types import DecisionRequest

BUG = {"type": "noul", "instructions": "Is this a bug report?"}


class Recorder:
    """Answers every question with its first option certain; records what each backend call was asked."""

    def __init__(self) -> None:
        self.calls: list[DecisionRequest] = []

    def __call__(self, request: DecisionRequest) -> list[Sequence[float]]:
        self.calls.append(request)
        return [[1.0] + [0.0] * (len(q.options) - 1) for q in request.questions]


def decider_for(recorder: Recorder, settings: DeciderSettings = DeciderSettings()) -> Decider:
    decider = Decider([FunctionBackend(recorder)], settings)
    decider.load()
    return decider


def test_a_question_named_twice_is_written_once() -> None:
    recorder = Recorder()
    questions = {"bug": BUG, "then": {**BUG, "instructions": "Urgent?", "depends_on": ["bug", "bug", "bug"]}}
    decider_for(recorder).ask("The app crashes.", questions)
    assert recorder.calls[1].questions[0].instructions == (
        "Urgent?\n\nAnswers already given about this state:\n- `bug` (Is this a bug report?): yes, probability 1.00"
    )


def test_copies_past_the_body_limit_are_refused_before_they_are_written_or_anything_is_read() -> None:
    """100 dependents of a 2 MiB question were 200 MiB of instructions built at once (1,000: 2 GB); the request
    is now refused from the sizes alone, holding no more than a few copies of the one long text."""
    recorder = Recorder()
    long = {"type": "noul", "instructions": "x" * (2 << 20)}
    questions = {"long": long, **{f"q{i}": {**BUG, "depends_on": ["long"]} for i in range(100)}}
    decider = decider_for(recorder)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match=r"209,716,500 bytes .* past the 33,554,432 .*\(--max-body-bytes\)"):
            decider.ask("s", questions)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held to refuse it"
    assert recorder.calls == []


def test_answers_that_grow_the_copies_past_the_limit_are_refused_before_their_stage_is_written() -> None:
    """What a line holds beyond its key and instructions (here a score's level, told by its description) is
    known only once answered: it is counted exactly before the stage is built."""
    recorder = Recorder()
    levels = ["y" * 10_000, "low", "high"]
    questions = {
        "size": {"type": "score", "instructions": "How big?", "criteria": levels},
        **{f"q{i}": {**BUG, "depends_on": ["size"]} for i in range(20)},
    }
    decider = decider_for(recorder, DeciderSettings(max_context_bytes=100_000))
    with pytest.raises(PayloadTooLarge, match=r"20\d,\d{3} bytes .* past the 100,000"):
        decider.ask("s", questions)
    assert [[q.key for q in call.questions] for call in recorder.calls] == [["size"]]


def test_the_server_answers_413_naming_the_flag(sparrow_server: str) -> None:
    questions: dict[str, Any] = {"long": {**BUG, "instructions": "x" * (1 << 20)}}
    questions.update({f"q{i}": {**BUG, "depends_on": ["long"]} for i in range(40)})
    body = {"model": "default", "state": "s", "questions": questions}
    response = httpx.post(sparrow_server + "/v1/systemone", json=body, timeout=60)
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert detail["error_type"] == "payload_too_large" and "(--max-body-bytes)" in detail["message"]
