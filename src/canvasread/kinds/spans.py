"""Spans (canvasread extension): every piece of the (text) state the instructions ask for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from canvasread.kinds.base import AnswerBase, Blank, rounded
from canvasread.kinds.pieces import PiecesKind, PiecesQuestion, SpanPiece, found_of, summary_of
from canvasread.types import Distribution, JSONValue, Question

# What separates the pieces on the answer line (and so never inside one).
SEPARATOR = ";"


class SpansQuestion(PiecesQuestion):
    """canvasread extension: every piece of the (text) state the instructions ask for."""

    type: Literal["spans"]


class SpansAnswer(AnswerBase):
    """canvasread extension: every piece found, by `start`; `complete` is false when the cap on pieces was hit."""

    type: Literal["spans"]
    spans: list[SpanPiece]
    confidence: float
    complete: bool


class Spans(PiecesKind):
    name = "spans"
    question_model = SpansQuestion
    answer_model = SpansAnswer
    header = "copy every piece of the state that answers"
    guide = (
        "Answer by copying, exactly, every piece of the state that answers the instructions, "
        f"in any order, separated by '{SEPARATOR}'. If there is none, leave the answer empty. "
        f"Answer line: name:piece{SEPARATOR}piece"
    )
    # A list needs room for several pieces and their separators.
    blank = Blank(room=112, separator=SEPARATOR)

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        found = found_of(distribution)
        pieces: list[JSONValue] = [
            {"text": p.text, "start": p.start, "end": p.end, "confidence": rounded(p.confidence, decimals)}
            for p in found.pieces
        ]
        score = rounded(found.confidence, decimals)
        return {"type": "spans", "spans": pieces, "confidence": score, "complete": found.complete}

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        return summary_of(answer["spans"], answer["confidence"])


KIND = Spans()
