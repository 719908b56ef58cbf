"""A noul: a yes/no question, answered with P(true)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from canvasread.kinds.base import (
    AnswerBase,
    Content,
    Kind,
    QuestionBase,
    WireModel,
    as_text,
    description,
    rounded,
    top_index,
)
from canvasread.types import AskIfValue, Distribution, JSONValue, Option, Question

# Each side's label on the canvas: words the tokenizer keeps whole, in the sense the prompt gives them.
SIDE_LABELS = {"true": "yes", "false": "no"}


class NoulCriteria(WireModel):
    true: Content | None = Field(default=None, description="What counts as a yes answer; empty or null: undescribed.")
    false: Content | None = Field(default=None, description="What counts as a no answer; empty or null: undescribed.")


class NoulQuestion(QuestionBase):
    type: Literal["noul"]
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _needs_something_to_ask(self) -> NoulQuestion:
        sides = (self.criteria.true, self.criteria.false) if self.criteria is not None else ()
        described = any(description(side) is not None for side in sides)
        if description(self.instructions) is None and not described:  # blank instructions ask nothing either
            raise ValueError("a noul question needs instructions or at least one described side of criteria")
        return self


class NoulAnswer(AnswerBase):
    type: Literal["noul"]
    noul: float


class Noul(Kind):
    name = "noul"
    question_model = NoulQuestion
    answer_model = NoulAnswer
    header = "yes or no"

    def options(self, question: Any) -> tuple[Option, ...]:
        criteria = question.criteria or NoulCriteria()
        return Option("true", description(criteria.true)), Option("false", description(criteria.false))

    def criteria(self, question: Question) -> JSONValue:
        return {option.name: option.description for option in question.options if option.description is not None}

    def labels(self, option_names: Sequence[str], pool: Sequence[str]) -> list[str]:
        return [SIDE_LABELS[name] for name in option_names]

    def describe(self, option: Option) -> str:
        default = "the statement holds" if option.name == "true" else "the statement does not hold"
        return default if option.description is None else as_text(option.description)

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        p_true = distribution.probabilities[question.option_names.index("true")]
        return {"type": "noul", "noul": rounded(p_true, decimals)}

    def probabilities_of(self, answer: Mapping[str, Any], option_names: Sequence[str]) -> tuple[float, ...]:
        p_true = float(answer["noul"])  # a noul answer carries only P(true)
        return tuple(p_true if name == "true" else 1.0 - p_true for name in option_names)

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        p = float(answer["noul"])
        return f"{'yes' if p >= 0.5 else 'no'}\nP(yes) {p:.3f}", {"yes": p, "no": 1.0 - p}

    def bucket(self, option_count: int) -> str | None:
        return "noul"

    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        return None if isinstance(value, bool) else f"{question.key!r} is a noul: its answers are true and false"

    def ask_if_value(self, question: Question, distribution: Distribution) -> AskIfValue:
        return question.option_names[top_index(distribution.probabilities)] == "true"

    def context(self, question: Question, distribution: Distribution) -> str:
        top = top_index(distribution.probabilities)
        said = "yes" if question.option_names[top] == "true" else "no"
        return f"{said}, probability {distribution.probabilities[top]:.2f}"


KIND = Noul()
