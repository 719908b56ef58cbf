"""A box: locate what the instructions describe in the request's one image, as four edges.

On a canvas each edge is read as two digit slots, tens then units, on a grid
of 100 positions. A tokenizer that splits numbers into digits (Gemma's does)
has no single token for "42", so an edge cannot be one slot over 100 labels.
Two adjacent digit slots can: the answer line is `name: top 12, bottom 66,
left 19, right 68` and each of its eight digits is a slot over the labels
0–9, verified in context like any other label. Edge value k (00–99) is the
fraction k / 99 of the image's height or width, so 00 is the top or left edge
and 99 the bottom or right one: a resolution of about 1%.

One read gives each digit slot a distribution; an edge's distribution over
the grid is the product of its tens and units distributions (the read gives
them separately), and its expected value is exact whatever their dependence,
since E[10·T + U] = 10·E[T] + E[U].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from canvasread.kinds.base import DIGITS, AnswerBase, Kind, QuestionBase, WireModel, rounded
from canvasread.types import AskIfValue, Capabilities, DecisionRequest, Distribution, JSONValue, Question

EDGES = ("top", "bottom", "left", "right")
# Slots per box, in canvas order: (top tens, top units, bottom tens, ..., right units).
SLOTS = 2 * len(EDGES)
# The tens digits place an edge to within a tenth of the image; the re-read rule judges a box on them alone,
# since a units digit is uncertain whenever the model is not sure of the exact percent.
TENS_SLOTS = tuple(range(0, SLOTS, 2))
GUIDE = (
    "Locate it in the image and answer with its bounding box: each edge as two digits from 00 to 99, "
    "top and bottom in hundredths of the image's height from its top (99 is the bottom edge), "
    "left and right in hundredths of its width from its left (99 is the right edge). "
    "Answer line: top TT, bottom BB, left LL, right RR"
)


class BoxQuestion(QuestionBase):
    """Locate what the instructions describe in the request's one image (image models only)."""

    type: Literal["box"]


class BoxCoordinates(WireModel):
    """Edges as fractions of the image: `top` ≤ `bottom` of its height, `left` ≤ `right` of its width."""

    top: float = Field(ge=0.0, le=1.0)
    bottom: float = Field(ge=0.0, le=1.0)
    left: float = Field(ge=0.0, le=1.0)
    right: float = Field(ge=0.0, le=1.0)


class BoxAnswer(AnswerBase):
    type: Literal["box"]
    box: BoxCoordinates
    confidence: float | None = Field(description="From 0 to 1; null when the model gives none.")


def edge_slot_texts() -> tuple[str, ...]:
    """The text written before each of the eight digit slots of an answer line (after `name: `)."""
    texts: list[str] = []
    for index, edge in enumerate(EDGES):
        texts += [f"{', ' if index else ''}{edge} ", ""]
    return tuple(texts)


def edge_distributions(slots: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """Four distributions over the 100-position grid from the eight digit slots' label distributions."""
    if len(slots) != SLOTS:
        raise ValueError(f"a box is read from {SLOTS} digit slots, not {len(slots)}")
    edges = []
    for tens, units in zip(slots[0::2], slots[1::2], strict=True):
        edges.append(tuple(p_tens * p_units for p_tens in tens for p_units in units))
    return tuple(edges)


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
    a clueless one 0, as the confidence of a choice does.
    """
    scores = []
    for distribution in edges:
        n = len(distribution)
        uniform = math.sqrt((n + 1) / (12.0 * (n - 1)))
        scores.append(min(1.0, max(0.0, 1.0 - edge_moments(distribution)[1] / uniform)))
    return sum(scores) / len(scores)


class Box(Kind):
    name = "box"
    question_model = BoxQuestion
    answer_model = BoxAnswer
    header = "locate"
    guide = GUIDE
    slot_texts = edge_slot_texts()
    judged_slots = TENS_SLOTS

    def refusal(self, model: str, capabilities: Capabilities, request: DecisionRequest) -> str | None:
        """A box locates something in the request's one image: a model that sees, and exactly one image."""
        if not capabilities.images:
            return f"model {model} cannot see images, so it cannot answer box questions"
        count = len(request.assets)
        return None if count == 1 else f"a box question needs exactly one image in the request; this one has {count}"

    def labels(self, option_names: Sequence[str], pool: Sequence[str]) -> list[str]:
        return list(DIGITS)  # every edge digit slot takes the ten digits

    def read_out(self, slots: Sequence[Sequence[float]]) -> Distribution:
        return Distribution((), edges=edge_distributions(slots))

    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        edges = box_edges(distribution.edges)
        return {
            "type": "box",
            "box": {edge: rounded(value, decimals) for edge, value in edges.items()},
            "confidence": rounded(box_confidence(distribution.edges), decimals),
        }

    def confidence(self, question: Question, distribution: Distribution) -> float:
        return box_confidence(distribution.edges)

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        edges = ", ".join(f"{edge} {at:.2f}" for edge, at in answer["box"].items())
        confident = answer.get("confidence")
        return f"{edges}\nconfidence {'none' if confident is None else f'{confident:.2f}'}", {}

    def bucket(self, option_count: int) -> str | None:
        return None  # no options: a box's answer passes calibration through

    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        return f"{question.key!r} is a box: its answer is four edges, which ask_if cannot test"

    def context(self, question: Question, distribution: Distribution) -> str:
        edges = ", ".join(f"{edge} {at:.2f}" for edge, at in box_edges(distribution.edges).items())
        return f"box at {edges} (fractions of the image), confidence {box_confidence(distribution.edges):.2f}"


KIND = Box()
