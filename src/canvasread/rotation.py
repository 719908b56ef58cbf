"""Option-order rotations (`order: "rotate"`): expand a request into rotated reads, then fold them back.

A model that favours the first or last listed option answers differently when
the caller reorders the options. With `rotate`, a choice question is read once
per cyclic rotation of its options, all in the same backend call, and the
distributions are mapped back to the caller's labels and averaged.

Exact invariance: if the backend's read of a variant depends only on that
variant's content (the sparrow model; the canvas backend seeds each variant's
noise from its content), shifting the caller's option list cyclically yields
the very same variants and the very same averaged numbers, bit for bit:
- rotations start from an anchor chosen by content (the option whose name
  sorts first), so the set of variants and their keys do not depend on where
  the caller's list starts;
- averages use `math.fsum`, which is exactly rounded and so independent of
  the order in which the variants are added up.

Large option sets: at most `MAX_ROTATIONS` rotations, evenly spaced — offsets
`⌊j·k / 8⌋` from the anchor for j = 0..7 — so every option is seen at 8
positions spread over the list; with k ≤ 8 options every rotation is read.

Only kinds whose options carry no order rotate (`Kind.rotates`: choices):
score levels are ordered by meaning (a level's score is its index), and a
noul's two sides always arrive as (true, false).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from canvasread.kinds import kind_of
from canvasread.types import DecisionRequest, DecisionResult, Distribution, InputWarning, JSONValue, Question

MAX_ROTATIONS = 8


def rotation_starts(question: Question) -> tuple[int, ...]:
    """Where each rotated read starts, as indices into the caller's options (one entry: read as given)."""
    count = len(question.options)
    if question.order != "rotate" or not kind_of(question.kind).rotates or count < 2:
        return (0,)
    names = question.option_names
    anchor = names.index(min(names))
    if count <= MAX_ROTATIONS:
        offsets = list(range(count))
    else:
        offsets = [j * count // MAX_ROTATIONS for j in range(MAX_ROTATIONS)]
    return tuple((anchor + offset) % count for offset in offsets)


def _variant(question: Question, index: int, start: int) -> Question:
    options = question.options[start:] + question.options[:start]
    return replace(question, key=f"{question.key}#rot{index}", options=options, order="as-given")


@dataclass(frozen=True)
class RotationPlan:
    """The request as the backend reads it, for each caller question the starts of its reads, and the caller's
    key of each rotated variant (`team#rot1` → `team`)."""

    request: DecisionRequest
    starts: tuple[tuple[int, ...], ...]
    callers: Mapping[str, str] = field(default_factory=dict)

    def fold(self, result: DecisionResult) -> DecisionResult:
        """Map the backend's per-read distributions back to one distribution per caller question."""
        distributions = iter(result.distributions)
        folded = []
        for starts in self.starts:
            reads = [next(distributions) for _ in starts]
            folded.append(reads[0] if len(starts) == 1 else _average(starts, reads))
        warnings = dict.fromkeys(self._at_caller(warning) for warning in result.warnings)
        return DecisionResult(tuple(folded), result.usage, tuple(warnings))

    def _at_caller(self, warning: InputWarning) -> InputWarning:
        """A warning about a rotated variant, located at the caller's question (one warning for all variants)."""
        if len(warning.loc) < 2 or warning.loc[0] != "questions" or warning.loc[1] not in self.callers:
            return warning
        return replace(warning, loc=("questions", self.callers[str(warning.loc[1])], *warning.loc[2:]))


def _average(starts: tuple[int, ...], reads: list[Distribution]) -> Distribution:
    """Average rotated reads label by label; each read's position i holds the caller's option (start + i) mod k."""
    count = len(reads[0].probabilities)
    probabilities = tuple(
        math.fsum(read.probabilities[(option - start) % count] for start, read in zip(starts, reads, strict=True))
        / len(reads)
        for option in range(count)
    )
    details: dict[str, JSONValue] = {"rotations": len(reads)}
    counted = [read.reads for read in reads if read.reads is not None]
    total = sum(counted) if len(counted) == len(reads) else None
    if total is not None:
        details["reads"] = total
    if any(read.details for read in reads):
        details["per_rotation"] = [dict(read.details) for read in reads]
    return Distribution(probabilities, details, reads=total)


def plan_rotations(request: DecisionRequest) -> RotationPlan:
    """Replace every rotating question by its rotated variants (keys `"{key}#rot{j}"`), in place, in one request."""
    starts = tuple(rotation_starts(question) for question in request.questions)
    if all(len(s) == 1 for s in starts):
        return RotationPlan(request, starts)
    questions: list[Question] = []
    callers: dict[str, str] = {}
    for question, question_starts in zip(request.questions, starts, strict=True):
        if len(question_starts) == 1:
            questions.append(question)
            continue
        variants = [_variant(question, j, start) for j, start in enumerate(question_starts)]
        questions.extend(variants)
        callers.update((variant.key, question.key) for variant in variants)
    return RotationPlan(replace(request, questions=tuple(questions)), starts, callers)
