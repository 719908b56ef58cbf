"""Stages (`depends_on`, `ask_if`): references, stage numbers, earlier answers in later prompts, skipping.

Driven through the `Decider` with a function backend that records what each
backend call was asked, so every assertion is about what a model would see,
and through the embedded sparrow model and the official SDK on a live server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from typesafe_sdk import TypeSafeClient

from canvasread.backends.base import FunctionBackend
from canvasread.catalog import open_decider
from canvasread.decide import Decider
from canvasread.errors import InvalidRequest
from canvasread.stages.graph import stage_numbers
from canvasread.stages.run import Given
from canvasread.types import DecisionRequest, Distribution, Found, JSONValue, Piece
from canvasread.wire import parse_request

BUG = {"type": "noul", "instructions": "Is this a bug report?"}
COMPONENT = {"type": "choice", "instructions": "Which component?", "criteria": {"ui": None, "api": None, "db": None}}
SEVERITY = {"type": "score", "instructions": "How severe?", "criteria": ["low", "mid", "high"]}


class Recorder:
    """Answers by question key (uniform when not given) and records the questions of every backend call."""

    def __init__(self, answers: dict[str, Sequence[float]]) -> None:
        self.answers = answers
        self.calls: list[DecisionRequest] = []

    def __call__(self, request: DecisionRequest) -> list[Sequence[float]]:
        self.calls.append(request)
        base = {q.key: q.key.split("#")[0] for q in request.questions}
        return [self.answers.get(base[q.key], [1 / len(q.options)] * len(q.options)) for q in request.questions]

    def asked(self) -> list[list[str]]:
        return [[q.key for q in call.questions] for call in self.calls]


def decider_for(recorder: Recorder) -> Decider:
    decider = Decider([FunctionBackend(recorder)])
    decider.load()
    return decider


def ask(decider: Decider, questions: dict[str, Any], **extensions: JSONValue) -> dict[str, Any]:
    return dict(decider.ask("The app crashes when I press save.", questions, **extensions))


def problems(questions: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    _, request = parse_request({"model": "m", "state": "s", "questions": questions})
    with pytest.raises(InvalidRequest) as raised:
        stage_numbers(request.questions)
    return [(p.loc, p.msg) for p in raised.value.problems]


def test_independent_questions_share_a_stage_and_dependents_come_after() -> None:
    questions = {
        "a": BUG,
        "b": SEVERITY,
        "c": {**COMPONENT, "depends_on": ["a"]},
        "d": {**SEVERITY, "ask_if": {"c": ["ui"]}},
        "e": {**BUG, "depends_on": ["a", "d"]},
    }
    _, request = parse_request({"model": "m", "state": "s", "questions": questions})
    assert stage_numbers(request.questions) == (0, 0, 1, 2, 3)


def test_a_chain_of_a_thousand_questions_is_numbered_without_recursion() -> None:
    questions = {"q0": BUG, **{f"q{i}": {**BUG, "depends_on": [f"q{i - 1}"]} for i in range(1, 1000)}}
    _, request = parse_request({"model": "m", "state": "s", "questions": questions})
    assert stage_numbers(request.questions) == tuple(range(1000))


def test_unknown_ids_and_self_references_are_located_at_the_key() -> None:
    found = problems(
        {
            "a": {**BUG, "depends_on": ["a"]},
            "b": {**BUG, "depends_on": ["a", "nope"]},
            "c": {**BUG, "ask_if": {"missing": [True]}},
        }
    )
    assert found == [
        (("questions", "a", "noul", "depends_on", 0), "a question cannot wait on itself"),
        (("questions", "b", "noul", "depends_on", 1), "there is no question 'nope' in this request"),
        (("questions", "c", "noul", "ask_if", "missing"), "there is no question 'missing' in this request"),
    ]


def test_a_cycle_is_located_at_the_reference_that_closes_it() -> None:
    [(loc, message)] = problems(
        {
            "root": BUG,
            "a": {**BUG, "depends_on": ["root", "c"]},
            "b": {**COMPONENT, "depends_on": ["a"]},
            "c": {**SEVERITY, "ask_if": {"b": ["ui"]}},
        }
    )
    assert message == "questions `a` → `c` → `b` → `a` wait on each other in a cycle"
    assert loc == ("questions", "b", "choice", "depends_on", 0)


@pytest.mark.parametrize(
    ("target", "value", "message"),
    [
        ("bug", "yes", "'bug' is a noul: its answers are true and false"),
        ("component", "cli", "'component' is a choice: its answers are the option names 'ui', 'api', 'db'"),
        ("severity", 3, "'severity' is a score: its answers are the level indices 0..2"),
        ("severity", True, "'severity' is a score: its answers are the level indices 0..2"),
    ],
)
def test_ask_if_values_must_be_answers_the_named_question_can_give(target: str, value: JSONValue, message: str) -> None:
    questions = {"bug": BUG, "component": COMPONENT, "severity": SEVERITY, "x": {**BUG, "ask_if": {target: [value]}}}
    assert problems(questions) == [(("questions", "x", "noul", "ask_if", target, 0), message)]


def test_the_earlier_answer_is_written_into_the_dependent_questions_instructions() -> None:
    recorder = Recorder({"bug": [0.9, 0.1], "component": [0.1, 0.7, 0.2], "severity": [0.1, 0.2, 0.7]})
    questions = {
        "bug": BUG,
        "component": {**COMPONENT, "depends_on": ["bug"]},
        "severity": {**SEVERITY, "depends_on": ["component", "bug"]},
        "plain": {"type": "noul", "criteria": {"true": "it is urgent"}, "depends_on": ["severity"]},
    }
    result = ask(decider_for(recorder), questions, diagnostics=True)
    assert recorder.asked() == [["bug"], ["component"], ["severity"], ["plain"]]
    assert recorder.calls[1].questions[0].instructions == (
        "Which component?\n\nAnswers already given about this state:\n"
        "- `bug` (Is this a bug report?): yes, probability 0.90"
    )
    assert recorder.calls[2].questions[0].instructions == (
        "How severe?\n\nAnswers already given about this state:\n"
        "- `component` (Which component?): api, probability 0.70\n"
        "- `bug` (Is this a bug report?): yes, probability 0.90"
    )
    assert recorder.calls[3].questions[0].instructions == (
        "Answers already given about this state:\n"
        "- `severity` (How severe?): level 2 of 0-2 (high), probability 0.70, expected score 1.60"
    )
    assert [a["diagnostics"]["stage"] for a in result["answers"].values()] == [0, 1, 2, 3]
    assert list(result["answers"]) == list(questions) and "skipped" not in result


def test_a_request_without_stages_is_one_backend_call_with_nothing_added() -> None:
    recorder = Recorder({})
    result = ask(decider_for(recorder), {"bug": BUG, "component": COMPONENT}, diagnostics=True)
    assert recorder.asked() == [["bug", "component"]]
    assert recorder.calls[0].questions[1].instructions == "Which component?"
    assert result["answers"]["bug"]["diagnostics"] == {"calibrated": False}
    assert set(result) == {"model", "answers", "usage"}


def test_ask_if_skips_questions_and_says_why() -> None:
    recorder = Recorder({"bug": [0.2, 0.8], "severity": [0.1, 0.8, 0.1]})
    questions = {
        "bug": BUG,
        "severity": SEVERITY,
        "component": {**COMPONENT, "ask_if": {"bug": [True]}},  # bug is false: skipped
        "after": {**BUG, "depends_on": ["component"]},  # waits on a skipped question: skipped too
        "refund": {**BUG, "ask_if": {"bug": [False], "severity": [1, 2]}},  # both hold: asked
        "high": {**BUG, "ask_if": {"severity": [2]}},
    }
    result = ask(decider_for(recorder), questions)
    assert recorder.asked() == [["bug", "severity"], ["refund"]]
    assert list(result["answers"]) == ["bug", "severity", "refund"]
    assert result["skipped"] == {
        "component": {
            "reason": "condition_not_met",
            "question": "bug",
            "answer": False,
            "values": [True],
            "message": "asked only if `bug` is one of [true]; it is false",
        },
        "after": {"reason": "dependency_skipped", "question": "component", "message": "`component` was skipped"},
        "high": {
            "reason": "condition_not_met",
            "question": "severity",
            "answer": 1,
            "values": [2],
            "message": "asked only if `severity` is one of [2]; it is 1",
        },
    }


def test_an_abstaining_answer_never_satisfies_ask_if() -> None:
    recorder = Recorder({"component": [0.5, 0.3, 0.2]})
    questions = {
        "component": {**COMPONENT, "min_confidence": 0.5},
        "ui_detail": {**BUG, "ask_if": {"component": ["ui"]}},
    }
    result = ask(decider_for(recorder), questions)
    assert result["answers"]["component"]["abstain"] is True
    assert result["skipped"]["ui_detail"]["reason"] == "condition_abstained"
    assert recorder.asked() == [["component"]]


def test_rotations_and_usage_work_inside_stages() -> None:
    recorder = Recorder({"component": [0.6, 0.3, 0.1]})
    questions = {"component": {**COMPONENT, "order": "rotate"}, "bug": {**BUG, "depends_on": ["component"]}}
    result = ask(decider_for(recorder), questions)
    assert recorder.asked() == [["component#rot0", "component#rot1", "component#rot2"], ["bug"]]
    # Each rotation puts 0.6 on whichever option it lists first, so the folded answer is uniform ...
    assert result["answers"]["component"]["probabilities"] == pytest.approx({"ui": 1 / 3, "api": 1 / 3, "db": 1 / 3})
    # ... and that folded answer, not a rotated read, is what the dependent question is told.
    assert recorder.calls[1].questions[0].instructions.endswith("(Which component?): ui, probability 0.33")
    assert result["usage"] == {"input_tokens": 2, "output_tokens": 4}  # the backend's usage, summed over stages


def test_the_embedded_model_reads_the_earlier_answer() -> None:
    """Sparrow answers the dependent question exactly as it answers the same words asked directly."""
    decider = open_decider()
    state = "My invoice shows a double charge for last month."
    staged = decider.ask(
        state, {"bug": BUG, "money": {**BUG, "instructions": "Is it about money?", "depends_on": ["bug"]}}
    )
    p_true = staged["answers"]["bug"]["noul"]  # type: ignore[index]
    said = "yes" if p_true >= 0.5 else "no"
    words = (
        "Is it about money?\n\nAnswers already given about this state:\n"
        f"- `bug` (Is this a bug report?): {said}, probability {max(p_true, 1 - p_true):.2f}"
    )
    direct = decider.ask(state, {"money": {"type": "noul", "instructions": words}})
    assert staged["answers"]["money"] == direct["answers"]["money"]  # type: ignore[index]
    plain = decider.ask(state, {"money": {"type": "noul", "instructions": "Is it about money?"}})
    assert plain["answers"]["money"] != direct["answers"]["money"]  # type: ignore[index]


def test_the_sdk_parses_a_response_with_skipped_questions(sparrow_server: str) -> None:
    questions = {
        "bug": BUG,
        "never": {**BUG, "ask_if": {"bug": [True]}},
        "always": {**BUG, "ask_if": {"bug": [True, False]}},
    }
    with TypeSafeClient(base_url=sparrow_server, api_key="local") as client:
        result = client.system_one("The app crashes on save", questions)
    body = result.raw_http_response.json()
    skipped = set(body["skipped"])
    assert skipped | set(result.answers) == {"bug", "never", "always"} and not skipped & set(result.answers)
    assert "always" in result.answers


@pytest.mark.parametrize(
    ("questions", "loc"),
    [
        ({"a": {**BUG, "depends_on": ["b"]}}, ["body", "questions", "a", "noul", "depends_on", 0]),
        (
            {"a": {**BUG, "depends_on": ["b"]}, "b": {**BUG, "ask_if": {"a": [True]}}},
            ["body", "questions", "b", "noul", "ask_if", "a"],
        ),
        ({"a": {**BUG, "ask_if": {"a": []}}}, ["body", "questions", "a", "noul", "ask_if", "a"]),
        ({"a": {**BUG, "alone": 1}}, ["body", "questions", "a", "noul", "alone"]),
    ],
)
def test_the_server_answers_422_at_the_offending_key(
    sparrow_server: str, questions: dict[str, Any], loc: list[str | int]
) -> None:
    response = httpx.post(
        sparrow_server + "/v1/systemone", json={"model": "default", "state": "s", "questions": questions}, timeout=30
    )
    assert response.status_code == 422
    assert [entry["loc"] for entry in response.json()["detail"]] == [loc]


def test_a_box_answer_is_told_as_its_edges_and_ask_if_cannot_name_a_box() -> None:
    box = {"type": "box", "instructions": "Where is the logo?"}
    assert problems({"logo": box, "x": {**BUG, "ask_if": {"logo": [True]}}}) == [
        (
            ("questions", "x", "noul", "ask_if", "logo", 0),
            "'logo' is a box: its answer is four edges, which ask_if cannot test",
        )
    ]
    _, request = parse_request({"model": "m", "state": "s", "questions": {"logo": box}})
    edge = (0.0, 0.0, 1.0, 0.0, 0.0)  # certain, at 0.5 on a five-point grid
    given = Given(request.questions[0], Distribution((), edges=(edge, edge, (1.0, 0, 0, 0, 0), (0, 0, 0, 0, 1.0))))
    assert given.line() == (
        "- `logo` (Where is the logo?): box at top 0.50, bottom 0.50, left 0.00, right 1.00 "
        "(fractions of the image), confidence 1.00"
    )


def test_span_answers_are_told_as_their_pieces_and_ask_if_cannot_name_a_span() -> None:
    span = {"type": "span", "instructions": "Who wrote?"}
    assert problems({"who": span, "x": {**BUG, "ask_if": {"who": [True]}}}) == [
        (
            ("questions", "x", "noul", "ask_if", "who", 0),
            "'who' is a span: its answer is pieces of the state, which ask_if cannot test",
        )
    ]
    questions = {"who": span, "all": {**span, "type": "spans"}}
    _, request = parse_request({"model": "m", "state": "s", "questions": questions})
    who, everyone = request.questions
    found = Found((Piece("Zoë", 7, 10, 0.9),), 0.9)
    assert Given(who, Distribution((), found=found)).line() == (
        '- `who` (Who wrote?): "Zoë" (characters 7-10 of the state), confidence 0.90'
    )
    both = Found((Piece("Zoë", 7, 10, 0.9), Piece("Ann", 20, 23, 0.6)), 0.6)
    assert Given(everyone, Distribution((), found=both)).line() == (
        '- `all` (Who wrote?): "Zoë" (characters 7-10 of the state); "Ann" (characters 20-23 of the state), '
        "confidence 0.60"
    )
    nothing = Given(who, Distribution((), found=Found((), 0.8))).line()
    assert nothing == "- `who` (Who wrote?): nothing found, confidence 0.80"
