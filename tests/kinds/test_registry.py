"""The registry of question kinds: what every kind provides, that the wire is built from it, that an unknown kind
is refused at the edge, that nothing outside `canvasread.kinds` switches on a kind's name, and that a kind added
to the registry alone flows through every layer (the README's walk-through)."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from helpers import FirstLabel

from canvasread.backends.base import FunctionBackend
from canvasread.calibration import Calibration, calibrate
from canvasread.canvas.backend import CanvasBackend, CanvasRuntime
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.capabilities import check_capabilities
from canvasread.decide import Decider
from canvasread.errors import InvalidRequest
from canvasread.kinds import KINDS, UnknownKind, kind_of
from canvasread.kinds.base import AnswerBase, Kind, QuestionBase, confidence, rounded, top_index
from canvasread.rotation import plan_rotations
from canvasread.stages.run import Given
from canvasread.types import (
    AskIfValue,
    DecisionRequest,
    Distribution,
    JSONValue,
    ModelCard,
    Option,
    Question,
    RequestOptions,
)
from canvasread.wire import SystemOneRequest, SystemOneResponse, parse_request

SOURCE = Path(__file__).parents[2] / "src" / "canvasread"
NAMES = "|".join(KINDS)
# A comparison or membership test against a kind's name, or a mapping keyed by kind names.
SWITCH = re.compile(
    rf"""(==|!=|\bin)\s*\(?\s*["']({NAMES})["']"""
    rf"""|["']({NAMES})["']\s*(==|!=|\bin\b)"""
    rf"""|\{{\s*["']({NAMES})["']\s*:"""
)


def type_literal(model: type[QuestionBase] | type[AnswerBase]) -> str:
    [value] = typing.get_args(model.model_fields["type"].annotation)
    return str(value)


def test_each_kind_is_registered_under_the_type_its_wire_models_carry() -> None:
    assert list(KINDS) == ["noul", "choice", "score", "box", "span", "spans"]
    for name, kind in KINDS.items():
        assert kind.name == name == type_literal(kind.question_model) == type_literal(kind.answer_model)


def test_the_wire_schema_is_built_from_the_registry() -> None:
    request = SystemOneRequest.model_json_schema()
    questions = request["properties"]["questions"]["additionalProperties"]
    assert sorted(questions["discriminator"]["mapping"]) == sorted(KINDS)
    response = SystemOneResponse.model_json_schema()
    answers = response["properties"]["answers"]["additionalProperties"]
    assert sorted(answers["discriminator"]["mapping"]) == sorted(KINDS)


def test_an_unknown_kind_is_refused_at_the_edge_never_guessed() -> None:
    with pytest.raises(InvalidRequest) as wire:
        parse_request({"model": "m", "state": "s", "questions": {"q": {"type": "rating", "instructions": "?"}}})
    assert [(p.loc, p.type, p.input) for p in wire.value.problems] == [
        (("questions", "q", "type"), "literal_error", "rating")
    ]
    # A request built by hand (the library's `Decider.decide_now`) meets the same refusal in the capability check.
    request = DecisionRequest("s", (Question("q", "rating", "?", (Option("a"), Option("b"))),))
    with pytest.raises(InvalidRequest) as hand:
        check_capabilities(ModelCard("m", "", "2026-01-01"), request)
    [problem] = hand.value.problems
    assert problem.loc == ("questions", "q") and "unknown question type 'rating'" in problem.msg
    assert "noul, choice, score, box, span, spans" in problem.msg
    with pytest.raises(UnknownKind):
        kind_of("rating")


def test_no_module_outside_the_kinds_package_switches_on_a_kinds_name() -> None:
    switches = [
        f"{path.relative_to(SOURCE)}:{number}: {line.strip()}"
        for path in SOURCE.rglob("*.py")
        if path.relative_to(SOURCE).parts[0] != "kinds"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SWITCH.search(line)
    ]
    assert switches == []


def test_the_switch_pattern_finds_what_it_is_for() -> None:
    """The scan above would pass vacuously if its pattern matched nothing: it must catch each form of switch."""
    caught = [
        'if question.kind == "box":',
        'if kind in ("span", "spans"):',
        'HEADERS = {"noul": "yes or no"}',
        'if answer["type"] == "noul":',
        'elif "choice" == name:',
    ]
    assert all(SWITCH.search(line) for line in caught)
    assert not SWITCH.search('QUESTIONS = [{"type": "noul", "instructions": "Refund?"}]')


# ---- a kind added to the registry alone ----------------------------------------------------------


class GradeQuestion(QuestionBase):
    type: Literal["grade"]


class GradeAnswer(AnswerBase):
    type: Literal["grade"]
    grade: str
    confidence: float


class Grade(Kind):
    """A school grade, A (best) to F: what a new kind's module holds, and nothing more."""

    name = "grade"
    question_model = GradeQuestion
    answer_model = GradeAnswer
    header = "grade it from A (best) to F"
    GRADES = ("A", "B", "C", "D", "E", "F")

    def options(self, question: Any) -> tuple[Option, ...]:
        return tuple(Option(grade) for grade in self.GRADES)

    def labels(self, option_names: Sequence[str], pool: Sequence[str]) -> list[str]:
        return list(option_names)

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        top = top_index(distribution.probabilities)
        return {
            "type": "grade",
            "grade": question.option_names[top],
            "confidence": rounded(confidence(distribution.probabilities), decimals),
        }

    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        return None if value in self.GRADES else f"{question.key!r} is a grade: its answers are A to F"

    def ask_if_value(self, question: Question, distribution: Distribution) -> AskIfValue:
        return question.option_names[top_index(distribution.probabilities)]

    def context(self, question: Question, distribution: Distribution) -> str:
        return f"grade {self.ask_if_value(question, distribution)}"


@pytest.fixture
def grade(monkeypatch: pytest.MonkeyPatch) -> Iterator[Question]:
    """The grade kind registered (as its module's line in `canvasread.kinds` would), and a question of it."""
    monkeypatch.setitem(typing.cast(dict[str, Kind], KINDS), "grade", Grade())
    yield Question("essay", "grade", "How good is the essay?", Grade().options(None), min_confidence=0.5)


def test_a_kind_registered_alone_is_planned_read_answered_calibrated_and_told(
    grade: Question, tokenizer: HFTokenizer
) -> None:
    card = ModelCard("canvas", "a canvas backend over a scripted reader", "2026-01-01")
    runtime = CanvasRuntime(FirstLabel(), tokenizer, canvas_length=64, max_positions=None, fingerprint="sha256:0")
    decider = Decider([CanvasBackend(card, lambda: runtime)])
    decider.load()
    request = DecisionRequest("An essay.", (grade,), options=RequestOptions(seed=1, diagnostics=True))
    answer = decider.decide_now("canvas", request).answers["essay"]
    assert answer["grade"] == "A" and answer["abstain"] is False
    assert answer["diagnostics"]["labels"] == {g: g for g in Grade.GRADES}  # type: ignore[index]
    calibration = Calibration("canvas", "sha256:0", {"grade/5-8": 2.0})
    tempered = calibrate(calibration, grade, Distribution((0.9, 0.02, 0.02, 0.02, 0.02, 0.02)))
    assert tempered.details["temperature"] == 2.0 and tempered.probabilities[0] < 0.9
    assert Given(grade, tempered).line() == "- `essay` (How good is the essay?): grade A"
    assert plan_rotations(DecisionRequest("s", (grade,))).starts == ((0,),)  # a new kind does not rotate
    plain = Decider([FunctionBackend(lambda request: [[1 / 6] * 6])])
    plain.load()
    assert plain.decide_now("default", DecisionRequest("s", (grade,))).answers["essay"]["grade"] == "A"
