"""`order: "rotate"`: rotated reads in one backend call, folded back and averaged, invariant to cyclic shifts."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import httpx
import pytest

from canvasread.backends.base import FunctionBackend, Gone, never_gone
from canvasread.calibration import Calibration
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.rotation import MAX_ROTATIONS
from canvasread.types import DecisionRequest, DecisionResult

INTENTS = {
    "billing": "charges, refunds, invoices",
    "technical": "something is broken",
    "sales": "buying more",
    "account": "login, password, profile",
    "shipping": "where is my parcel",
    "legal": None,
    "feedback": "praise or complaints about the product",
    "security": "fraud, stolen card, suspicious activity",
    "cancel": "close the account or stop the subscription",
    "careers": "jobs",
    "press": None,
    "partners": "resellers and integrations",
}


def _weight(name: str) -> float:
    return 1 + hashlib.sha256(name.encode()).digest()[0] / 64


def position_biased(request: DecisionRequest) -> list[tuple[float, ...]]:
    """A model that depends only on each question's content, and strongly prefers options listed first."""
    reads = []
    for question in request.questions:
        scores = [_weight(name) / (1 + position) for position, name in enumerate(question.option_names)]
        reads.append(tuple(s / sum(scores) for s in scores))
    return reads


def first_listed(request: DecisionRequest) -> list[tuple[float, ...]]:
    """All mass on whichever option is listed first."""
    return [tuple(1.0 if i == 0 else 0.0 for i in range(len(q.options))) for q in request.questions]


def _shifted(criteria: dict[str, Any], shift: int) -> dict[str, Any]:
    names = list(criteria)
    return {name: criteria[name] for name in names[shift:] + names[:shift]}


def _probabilities(decider: Decider, criteria: dict[str, Any], order: str, **extra: Any) -> dict[str, float]:
    question = {"type": "choice", "instructions": "Which team should handle this?", "criteria": criteria, **extra}
    answers: Any = decider.ask("My card was stolen and I see charges I did not make", {"q": question}, order=order)
    probabilities: dict[str, float] = answers["answers"]["q"]["probabilities"]
    assert list(probabilities) == list(criteria)  # answers keep the caller's order
    return probabilities


def _loaded(backend: FunctionBackend) -> Decider:
    decider = Decider([backend])
    decider.load()
    return decider


@pytest.fixture(scope="module")
def sparrow() -> Iterator[Decider]:
    yield open_decider()


@pytest.mark.parametrize("count", [2, 5, 8, 12])
def test_rotate_is_exactly_invariant_to_cyclic_shifts_with_a_function_backend(count: int) -> None:
    decider = _loaded(FunctionBackend(position_biased))
    criteria = dict(list(INTENTS.items())[:count])
    reference = _probabilities(decider, criteria, "rotate")
    for shift in range(1, count):
        assert _probabilities(decider, _shifted(criteria, shift), "rotate") == reference
    # the same shifts do move the as-given answers of this biased model, so the check above can fail
    assert _probabilities(decider, _shifted(criteria, 1), "as-given") != _probabilities(decider, criteria, "as-given")


@pytest.mark.parametrize("count", [3, 8, 12])
def test_rotate_is_exactly_invariant_to_cyclic_shifts_with_sparrow(sparrow: Decider, count: int) -> None:
    criteria = dict(list(INTENTS.items())[:count])
    reference = _probabilities(sparrow, criteria, "rotate")
    for shift in range(1, count):
        assert _probabilities(sparrow, _shifted(criteria, shift), "rotate") == reference


def test_rotate_stays_exact_with_calibration_applied() -> None:
    class Fingerprinted(FunctionBackend):
        @property
        def fingerprint(self) -> str:
            return "sha256:x"

    decider = _loaded(Fingerprinted(position_biased))
    decider.use_calibration(Calibration("function", "sha256:x", {"choice/9-16": 0.7}))
    reference = _probabilities(decider, INTENTS, "rotate")
    assert all(_probabilities(decider, _shifted(INTENTS, s), "rotate") == reference for s in range(1, len(INTENTS)))


def test_all_rotations_of_a_small_question_are_read_in_one_backend_call() -> None:
    seen: list[DecisionRequest] = []

    def record(request: DecisionRequest) -> list[tuple[float, ...]]:
        seen.append(request)
        return first_listed(request)

    backend = FunctionBackend(record)
    decider = _loaded(backend)
    criteria = dict(list(INTENTS.items())[:5])
    probabilities = _probabilities(decider, criteria, "rotate")
    assert backend.batches == [1]
    [request] = seen
    assert [q.key for q in request.questions] == [f"q#rot{j}" for j in range(5)]
    assert sorted(q.option_names[0] for q in request.questions) == sorted(criteria)
    assert all(q.order == "as-given" for q in request.questions)
    # each option was listed first exactly once, so a first-listed model averages to uniform
    assert probabilities == {name: pytest.approx(0.2) for name in criteria}


def test_large_option_sets_read_eight_evenly_spaced_rotations() -> None:
    seen: list[DecisionRequest] = []

    def record(request: DecisionRequest) -> list[tuple[float, ...]]:
        seen.append(request)
        return first_listed(request)

    decider = _loaded(FunctionBackend(record))
    probabilities = _probabilities(decider, INTENTS, "rotate")
    [request] = seen
    assert len(request.questions) == MAX_ROTATIONS
    names = list(INTENTS)
    anchor = names.index(min(names))
    starts = [names.index(q.option_names[0]) for q in request.questions]
    assert starts == [(anchor + j * len(names) // MAX_ROTATIONS) % len(names) for j in range(MAX_ROTATIONS)]
    assert sorted(probabilities.values()) == [0.0] * 4 + [pytest.approx(1 / 8)] * 8


def test_noul_and_score_questions_are_read_once_and_rotations_are_reported() -> None:
    backend = FunctionBackend(lambda request: [(0.5,) * len(q.options) for q in request.questions])
    decider = _loaded(backend)
    questions = {
        "n": {"type": "noul", "instructions": "Is it urgent?"},
        "s": {"type": "score", "criteria": ["low", "mid", "high"]},
        "c": {"type": "choice", "criteria": {"x": None, "y": None}, "order": "rotate"},
    }
    answers: Any = decider.ask("state", questions, order="rotate", diagnostics=True)
    assert answers["usage"]["output_tokens"] == 4  # noul, score, and two rotations of the choice
    assert answers["answers"]["c"]["diagnostics"] == {"rotations": 2, "calibrated": False}
    assert answers["answers"]["n"]["diagnostics"] == {"calibrated": False}


def test_rotated_read_details_are_kept_and_read_counts_summed() -> None:
    class Detailed(FunctionBackend):
        def decide(self, jobs: Sequence[DecisionRequest], gone: Gone = never_gone) -> list[DecisionResult | None]:
            return [
                DecisionResult(tuple(replace(d, details={"reads": 2}, reads=2) for d in r.distributions), r.usage)
                for r in super().decide(jobs, gone)
            ]

    decider = _loaded(Detailed(position_biased))
    question = {"type": "choice", "criteria": {"x": None, "y": None, "z": None}}
    answers: Any = decider.ask("state", {"q": question}, order="rotate", diagnostics=True)
    details = answers["answers"]["q"]["diagnostics"]
    assert details == {"rotations": 3, "reads": 6, "per_rotation": [{"reads": 2}] * 3, "calibrated": False}


def test_rotate_over_http(sparrow_server: str) -> None:
    body = {
        "model": "default",
        "state": "Where is my parcel? It was due on Monday.",
        "diagnostics": True,
        "questions": {"team": {"type": "choice", "criteria": INTENTS, "order": "rotate"}},
    }
    answer = httpx.post(sparrow_server + "/v1/systemone", json=body, timeout=30).json()["answers"]["team"]
    assert answer["diagnostics"]["rotations"] == MAX_ROTATIONS
    shifted = {**body, "questions": {"team": {"type": "choice", "criteria": _shifted(INTENTS, 5), "order": "rotate"}}}
    again = httpx.post(sparrow_server + "/v1/systemone", json=shifted, timeout=30).json()["answers"]["team"]
    assert again["probabilities"] == answer["probabilities"]
