"""Turn a distribution over a question's options into a Jev-shaped answer.

Pure functions shared by every backend, so the wire shape cannot drift
between models: noul has no confidence, choice and score do, score is the
expected level, a box is its four expected edges, and numbers are rounded
only at the very end (the hosted API computes the score before rounding, and
so do we). Span and spans answers (canvasread extensions) carry pieces of the
state by character offsets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from canvasread.types import Distribution, Found, JSONValue, Question


def confidence(probabilities: Sequence[float]) -> float:
    """How far the top option stands above a uniform guess: `(p_max − 1/k) / (1 − 1/k)` clipped to [0, 1].

    This is the formula that reproduces the hosted API's numbers; with one
    option there is nothing to doubt, so it is 1.
    """
    k = len(probabilities)
    if k <= 1:
        return 1.0
    uniform = 1.0 / k
    value = (max(probabilities) - uniform) / (1.0 - uniform)
    return min(1.0, max(0.0, value))


def expected_score(probabilities: Sequence[float]) -> float:
    """Σ i·p_i over levels: a float in [0, N−1], as the hosted API reports it."""
    return sum(level * p for level, p in enumerate(probabilities))


def top_index(probabilities: Sequence[float]) -> int:
    """The argmax; ties go to the earliest option so answers are stable."""
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))


def edge_moments(distribution: Sequence[float]) -> tuple[float, float]:
    """Mean and standard deviation of an edge over its grid (entry k of n sits at k / (n − 1))."""
    step = 1.0 / (len(distribution) - 1)
    mean = sum(k * step * p for k, p in enumerate(distribution))
    variance = sum((k * step - mean) ** 2 * p for k, p in enumerate(distribution))
    return mean, math.sqrt(max(0.0, variance))


def box_edges(edges: Sequence[Sequence[float]]) -> dict[str, float]:
    """Each edge's expected position; a pair read the wrong way round (top below bottom) is put in order."""
    top, bottom, left, right = (edge_moments(distribution)[0] for distribution in edges)
    return {"top": min(top, bottom), "bottom": max(top, bottom), "left": min(left, right), "right": max(left, right)}


def box_confidence(edges: Sequence[Sequence[float]]) -> float:
    """1 − σ/σ_uniform per edge, clipped to [0, 1], averaged over the four edges.

    σ is the spread of the edge's read position; σ_uniform is that of a read
    that knows nothing (uniform over the grid), so a certain read scores 1 and
    a clueless one 0, as `confidence` does for choices.
    """
    scores = []
    for distribution in edges:
        n = len(distribution)
        uniform = math.sqrt((n + 1) / (12.0 * (n - 1)))
        scores.append(min(1.0, max(0.0, 1.0 - edge_moments(distribution)[1] / uniform)))
    return sum(scores) / len(scores)


def answer_confidence(question: Question, distribution: Distribution) -> float:
    """The confidence that `min_confidence` is compared against, for any kind of question."""
    if question.kind == "box":
        return box_confidence(distribution.edges)
    if distribution.found is not None:
        return distribution.found.confidence
    return confidence(distribution.probabilities)


def span_answer(question: Question, found: Found, decimals: int | None) -> dict[str, JSONValue]:
    """A span: its one piece, or not found (`""` at 0, 0, still `state[start:end]`); spans: every piece."""
    pieces: list[JSONValue] = [
        {"text": p.text, "start": p.start, "end": p.end, "confidence": _round(p.confidence, decimals)}
        for p in found.pieces
    ]
    score = _round(found.confidence, decimals)
    if question.kind == "spans":
        return {"type": "spans", "spans": pieces, "confidence": score, "complete": found.complete}
    first = found.pieces[0] if found.pieces else None
    text, start, end = (first.text, first.start, first.end) if first is not None else ("", 0, 0)
    return {"type": "span", "found": first is not None, "text": text, "start": start, "end": end, "confidence": score}


def _round(value: float, decimals: int | None) -> float:
    return value if decimals is None else round(value, decimals)


def build_answer(
    question: Question,
    distribution: Distribution,
    *,
    decimals: int | None = None,
    diagnostics: Mapping[str, JSONValue] | None = None,
) -> dict[str, JSONValue]:
    """The answer object for one question; keys follow the hosted API's order."""
    probabilities = distribution.probabilities
    names = question.option_names
    answer: dict[str, JSONValue]
    if question.kind == "noul":
        p_true = probabilities[names.index("true")]
        answer = {"type": "noul", "noul": _round(p_true, decimals)}
    elif question.kind == "choice":
        answer = {
            "type": "choice",
            "choice": names[top_index(probabilities)],
            "confidence": _round(confidence(probabilities), decimals),
            "probabilities": {name: _round(p, decimals) for name, p in zip(names, probabilities, strict=True)},
        }
    elif distribution.found is not None:
        answer = span_answer(question, distribution.found, decimals)
    elif question.kind == "box":
        answer = {
            "type": "box",
            "box": {edge: _round(value, decimals) for edge, value in box_edges(distribution.edges).items()},
            "confidence": _round(box_confidence(distribution.edges), decimals),
        }
    else:
        answer = {
            "type": "score",
            "score": _round(expected_score(probabilities), decimals),
            "confidence": _round(confidence(probabilities), decimals),
            "legend": {option.name: option.description for option in question.options},
            "probabilities": {name: _round(p, decimals) for name, p in zip(names, probabilities, strict=True)},
        }
    if question.min_confidence is not None:
        answer["abstain"] = answer_confidence(question, distribution) < question.min_confidence
    if diagnostics is not None:
        answer["diagnostics"] = dict(diagnostics)
    return answer
