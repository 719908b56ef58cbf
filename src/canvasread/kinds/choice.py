"""A choice: pick one of the caller's named options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from canvasread.kinds.base import AnswerBase, Kind, QuestionBase, confidence, description, rounded, top_index
from canvasread.settings import MAX_OPTIONS
from canvasread.types import AskIfValue, Capabilities, Distribution, JSONValue, Option, Question

# How many option names an ask_if refusal lists before it says "…".
SHOWN_NAMES = 10


class ChoiceQuestion(QuestionBase):
    type: Literal["choice"]
    criteria: dict[str, Any] = Field(min_length=1, max_length=MAX_OPTIONS)


class ChoiceAnswer(AnswerBase):
    type: Literal["choice"]
    choice: str
    confidence: float
    probabilities: dict[str, float]


class Choice(Kind):
    name = "choice"
    question_model = ChoiceQuestion
    answer_model = ChoiceAnswer
    header = "choose one"
    relabel = True
    rotates = True  # a choice's options carry no order, so reading them in rotations averages out position bias

    def options(self, question: Any) -> tuple[Option, ...]:
        return tuple(Option(name, description(text)) for name, text in question.criteria.items())

    def criteria(self, question: Question) -> JSONValue:
        return {option.name: option.description for option in question.options}

    def option_limit(self, capabilities: Capabilities) -> tuple[int, str] | None:
        return capabilities.max_options, "options"

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        names, probabilities = question.option_names, distribution.probabilities
        return {
            "type": "choice",
            "choice": names[top_index(probabilities)],
            "confidence": rounded(confidence(probabilities), decimals),
            "probabilities": {name: rounded(p, decimals) for name, p in zip(names, probabilities, strict=True)},
        }

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        return f"{answer['choice']}\nconfidence {answer['confidence']:.2f}", dict(answer["probabilities"])

    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        names = question.option_names
        if isinstance(value, str) and value in names:
            return None
        shown = ", ".join(repr(name) for name in names[:SHOWN_NAMES]) + (", …" if len(names) > SHOWN_NAMES else "")
        return f"{question.key!r} is a choice: its answers are the option names {shown}"

    def ask_if_value(self, question: Question, distribution: Distribution) -> AskIfValue:
        return question.option_names[top_index(distribution.probabilities)]

    def context(self, question: Question, distribution: Distribution) -> str:
        top = top_index(distribution.probabilities)
        return f"{question.option_names[top]}, probability {distribution.probabilities[top]:.2f}"


KIND = Choice()
