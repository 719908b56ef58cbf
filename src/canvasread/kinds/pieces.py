"""What span and spans share: kinds answered with pieces of the (text) state, by character offsets."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from canvasread.kinds.base import Content, Kind, QuestionBase, WireModel, description
from canvasread.types import AskIfValue, Capabilities, DecisionRequest, Distribution, Found, JSONValue, Question


class PiecesQuestion(QuestionBase):
    instructions: Content = Field(description="What to find in the state.")
    criteria: Any = Field(None, description="Not allowed: the answers are pieces of the state, not options.")

    @field_validator("instructions")
    @classmethod
    def _asks_something(cls, value: Content) -> Content:
        if description(value) is None:  # blank: nothing to find, as a noul's blank instructions ask nothing
            raise ValueError("span questions need instructions: what to find in the state")
        return value

    @field_validator("criteria")
    @classmethod
    def _no_criteria(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("span questions take no criteria: their answers are pieces of the state's own text")
        return value


class SpanPiece(WireModel):
    text: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    confidence: float


class PiecesKind(Kind):
    """A kind whose answer is pieces of the state: it needs a text state and a model that reads the state back."""

    def refusal(self, model: str, capabilities: Capabilities, request: DecisionRequest) -> str | None:
        return None if capabilities.spans else f"model {model} cannot answer {self.name} questions"

    def state_refusal(self, state: JSONValue) -> str | None:
        """Span answers are character offsets into the state, so the state must be text."""
        if isinstance(state, str):
            return None
        kind = "an object" if isinstance(state, dict) else "an array"
        return (
            f"a {self.name} question answers with character offsets into a text state; this state is {kind} "
            "(send the text to search as the state)"
        )

    def confidence(self, question: Question, distribution: Distribution) -> float:
        return found_of(distribution).confidence

    def bucket(self, option_count: int) -> str | None:
        return None  # no options: the pieces pass calibration through

    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        return f"{question.key!r} is a {self.name}: its answer is pieces of the state, which ask_if cannot test"

    def context(self, question: Question, distribution: Distribution) -> str:
        """Each piece quoted with its offsets, or that none was found."""
        found = found_of(distribution)
        if not found.pieces:
            return f"nothing found, confidence {found.confidence:.2f}"
        quoted = "; ".join(
            f"{json.dumps(piece.text, ensure_ascii=False)} (characters {piece.start}-{piece.end} of the state)"
            for piece in found.pieces
        )
        return f"{quoted}, confidence {found.confidence:.2f}"


def found_of(distribution: Distribution) -> Found:
    """What the read found; a distribution of a pieces kind always carries it."""
    if distribution.found is None:
        raise ValueError("a span or spans distribution carries what was found")
    return distribution.found


def summary_of(pieces: list[Mapping[str, Any]], confidence: float) -> tuple[str, dict[str, float]]:
    """Pieces in words for a person, each with its offsets; the bars are the pieces' confidences."""
    words = "\n".join(f"{p['text']!r} at {p['start']}:{p['end']}" for p in pieces) or "not found"
    return f"{words}\nconfidence {confidence:.2f}", {p["text"]: p["confidence"] for p in pieces}
