"""A span (canvasread extension): the piece of the (text) state the instructions ask for, by character offsets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from canvasread.kinds.base import AnswerBase, Blank, rounded
from canvasread.kinds.pieces import PiecesKind, PiecesQuestion, found_of, summary_of
from canvasread.types import Distribution, JSONValue, Question


class SpanQuestion(PiecesQuestion):
    """canvasread extension: the piece of the (text) state the instructions ask for, by character offsets."""

    type: Literal["span"]


class SpanAnswer(AnswerBase):
    """canvasread extension: `text` is `state[start:end]` (character offsets); not found: "", 0, 0."""

    type: Literal["span"]
    found: bool
    text: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    confidence: float


class Span(PiecesKind):
    name = "span"
    question_model = SpanQuestion
    answer_model = SpanAnswer
    header = "copy the piece of the state that answers"
    guide = (
        "Answer by copying, exactly, the shortest piece of the state that answers the instructions. "
        "If the state holds no such piece, leave the answer empty. Answer line: name:piece"
    )
    # Room for an answer of up to 47 tokens (names, dates, addresses, a sentence) plus its end marker.
    blank = Blank(room=48)

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        """Its one piece, or not found (`""` at 0, 0, still `state[start:end]`)."""
        found = found_of(distribution)
        first = found.pieces[0] if found.pieces else None
        text, start, end = (first.text, first.start, first.end) if first is not None else ("", 0, 0)
        score = rounded(found.confidence, decimals)
        return {
            "type": "span",
            "found": first is not None,
            "text": text,
            "start": start,
            "end": end,
            "confidence": score,
        }

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        return summary_of([answer] if answer["found"] else [], answer["confidence"])


KIND = Span()
