"""Turn a distribution over a question's options into a Jev-shaped answer.

Shared by every backend, so the wire shape cannot drift between models: each
kind (`canvasread.kinds`) writes its own answer and confidence, and this
module adds what every answer may carry, `abstain` and `diagnostics`.
Numbers are rounded only at the very end (the hosted API computes the score
before rounding, and so do we).
"""

from __future__ import annotations

from collections.abc import Mapping

from canvasread.kinds import kind_of
from canvasread.types import Distribution, JSONValue, Question


def answer_confidence(question: Question, distribution: Distribution) -> float:
    """The confidence that `min_confidence` is compared against, for any kind of question."""
    return kind_of(question.kind).confidence(question, distribution)


def build_answer(
    question: Question,
    distribution: Distribution,
    *,
    decimals: int | None = None,
    diagnostics: Mapping[str, JSONValue] | None = None,
) -> dict[str, JSONValue]:
    """The answer object for one question; keys follow the hosted API's order."""
    answer = kind_of(question.kind).answer(question, distribution, decimals)
    if question.min_confidence is not None:
        answer["abstain"] = answer_confidence(question, distribution) < question.min_confidence
    if diagnostics is not None:
        answer["diagnostics"] = dict(diagnostics)
    return answer
