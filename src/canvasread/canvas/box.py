"""Box questions on a canvas: each edge is read as two digit slots, tens then units, on a grid of 100 positions.

A tokenizer that splits numbers into digits (Gemma's does) has no single
token for "42", so an edge cannot be one slot over 100 labels. Two adjacent
digit slots can: the answer line is `name: top 12, bottom 66, left 19, right 68`
and each of its eight digits is a slot over the labels 0–9, verified in
context like any other label. Edge value k (00–99) is the fraction k / 99 of
the image's height or width, so 00 is the top or left edge and 99 the bottom
or right one: a resolution of about 1%.

One read gives each digit slot a distribution; an edge's distribution over
the grid is the product of its tens and units distributions (the read gives
them separately), and its expected value is exact whatever their dependence,
since E[10·T + U] = 10·E[T] + E[U].
"""

from __future__ import annotations

from collections.abc import Sequence

from canvasread.canvas.labels import SCORE_LABELS
from canvasread.types import BOX_EDGES

DIGITS = SCORE_LABELS
# Slots per box, in canvas order: (top tens, top units, bottom tens, ..., right units).
SLOTS = 2 * len(BOX_EDGES)
# The tens digits place an edge to within a tenth of the image; the re-read rule judges a box on them alone,
# since a units digit is uncertain whenever the model is not sure of the exact percent.
TENS_SLOTS = tuple(range(0, SLOTS, 2))
GUIDE = (
    "Locate it in the image and answer with its bounding box: each edge as two digits from 00 to 99, "
    "top and bottom in hundredths of the image's height from its top (99 is the bottom edge), "
    "left and right in hundredths of its width from its left (99 is the right edge). "
    "Answer line: top TT, bottom BB, left LL, right RR"
)


def slot_texts() -> list[str]:
    """The text written before each of the eight digit slots of an answer line (after `name: `)."""
    texts = []
    for index, edge in enumerate(BOX_EDGES):
        texts += [f"{', ' if index else ''}{edge} ", ""]
    return texts


def edge_distributions(slots: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """Four distributions over the 100-position grid from the eight digit slots' label distributions."""
    if len(slots) != SLOTS:
        raise ValueError(f"a box is read from {SLOTS} digit slots, not {len(slots)}")
    edges = []
    for tens, units in zip(slots[0::2], slots[1::2], strict=True):
        edges.append(tuple(p_tens * p_units for p_tens in tens for p_units in units))
    return tuple(edges)
