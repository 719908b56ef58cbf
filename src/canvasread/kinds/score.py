"""A score: a level from 0 to N−1 on the caller's ordered scale, answered with the expected level."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from canvasread.kinds.base import (
    DIGITS,
    AnswerBase,
    Content,
    Kind,
    QuestionBase,
    as_text,
    confidence,
    rounded,
    top_index,
)
from canvasread.settings import MAX_LEVELS
from canvasread.types import AskIfValue, Capabilities, Distribution, JSONValue, Option, Question


class ScoreQuestion(QuestionBase):
    type: Literal["score"]
    criteria: list[Content] = Field(min_length=1, max_length=MAX_LEVELS)


class ScoreAnswer(AnswerBase):
    type: Literal["score"]
    score: float
    confidence: float
    legend: dict[str, Any]
    probabilities: dict[str, float]


def expected_score(probabilities: Sequence[float]) -> float:
    """Σ i·p_i over levels: a float in [0, N−1], as the hosted API reports it."""
    return sum(level * p for level, p in enumerate(probabilities))


class Score(Kind):
    name = "score"
    question_model = ScoreQuestion
    answer_model = ScoreAnswer
    header = "score from 0 (lowest) to {top}"

    def options(self, question: Any) -> tuple[Option, ...]:
        # Levels are echoed in the legend as sent, so "" stays "".
        return tuple(Option(str(level), text) for level, text in enumerate(question.criteria))

    def criteria(self, question: Question) -> JSONValue:
        return [option.description for option in question.options]

    def option_limit(self, capabilities: Capabilities) -> tuple[int, str] | None:
        return capabilities.max_levels, "levels"

    def labels(self, option_names: Sequence[str], pool: Sequence[str]) -> list[str]:
        return list(DIGITS[: len(option_names)])

    def describe(self, option: Option) -> str:
        return as_text(option.description)

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        names, probabilities = question.option_names, distribution.probabilities
        return {
            "type": "score",
            "score": rounded(expected_score(probabilities), decimals),
            "confidence": rounded(confidence(probabilities), decimals),
            "legend": {option.name: option.description for option in question.options},
            "probabilities": {name: rounded(p, decimals) for name, p in zip(names, probabilities, strict=True)},
        }

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        legend = answer.get("legend", {})
        named = {legend.get(index, index): p for index, p in answer["probabilities"].items()}
        nearest = legend.get(str(round(answer["score"])), str(round(answer["score"])))
        return f"{nearest} (score {answer['score']:.2f})\nconfidence {answer['confidence']:.2f}", named

    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        levels = len(question.options)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < levels:
            return None
        return f"{question.key!r} is a score: its answers are the level indices 0..{levels - 1}"

    def ask_if_value(self, question: Question, distribution: Distribution) -> AskIfValue:
        return top_index(distribution.probabilities)

    def context(self, question: Question, distribution: Distribution) -> str:
        probabilities = distribution.probabilities
        top = top_index(probabilities)
        level = f"level {top} of 0-{len(question.options) - 1} ({as_text(question.options[top].description)})"
        return f"{level}, probability {probabilities[top]:.2f}, expected score {expected_score(probabilities):.2f}"


KIND = Score()
