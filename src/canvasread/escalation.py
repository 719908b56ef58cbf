"""Escalation: questions a model is unsure of, re-asked of another served model (`serve --escalate TARGET
--escalate-below P`, or per request the canvasread extension `escalate: {"below": P, "to": TARGET}`).

After each stage is read and calibrated, every question whose confidence (the kind's, the one `min_confidence`
compares) is below P is asked again of the target: the same state, assets and request options, through the
target's own queue, rotations and calibration, and its answer replaces the first, so later stages and
`min_confidence` see it. The target is any served model: a local one or a wing's (`--upstream-systemone`).
With diagnostics every answer says which model answered (`answered_by`), an escalated one also what the first
model said (`escalated_from`: its name and confidence). `usage` counts both models' tokens and
`usage.escalation` the target, the questions re-asked and the target's tokens; `/metrics` counts re-asked
questions by model and target. A question the target cannot take (its capabilities refuse it) keeps its
first answer; when the target fails (not ready, overloaded, down), the first answers stand and their
diagnostics say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from canvasread.capabilities import check_capabilities
from canvasread.errors import CanvasreadError, FieldProblem, InvalidRequest, NotReady
from canvasread.kinds import kind_of
from canvasread.types import DecisionRequest, DecisionResult, Distribution, JSONValue, ModelCard, RequestOptions, Usage

ServedT = TypeVar("ServedT")


def check_threshold(below: float | None, where: str) -> None:
    """A threshold is a confidence: from 0 (never escalate) to 1 (escalate everything not certain)."""
    if below is not None and not 0.0 <= below <= 1.0:
        raise ValueError(f"{where} must be between 0 and 1, not {below}")


def chosen(target: str | None, below: float | None, options: RequestOptions) -> tuple[str, float] | None:
    """The target and threshold for one request: its `escalate` over the server's; None when off."""
    threshold = options.escalate_below if options.escalate_below is not None else below
    if threshold is None or threshold <= 0.0:
        return None
    name = options.escalate_to or target
    if name is None:
        problem = "no model to escalate to: give escalate.to, or start the server with --escalate TARGET"
        raise InvalidRequest([FieldProblem(("escalate",), problem)])
    return name, threshold


@dataclass(eq=False)
class Escalation(Generic[ServedT]):
    """One request's escalation: its source and target models (`target` is the decider's served model), the
    threshold, why the target cannot answer now (None: it can), and what it has re-asked so far."""

    source: str
    target: ServedT
    card: ModelCard
    below: float
    unready: str | None = None
    questions: int = 0
    spent: Usage = field(default_factory=Usage)

    def low(self, request: DecisionRequest, result: DecisionResult) -> tuple[int, ...]:
        """The questions to re-ask: below the threshold and within what the target can take."""
        return tuple(
            i
            for i, (question, read) in enumerate(zip(request.questions, result.distributions, strict=True))
            if kind_of(question.kind).confidence(question, read) < self.below and self._takes(request, i)
        )

    def _takes(self, request: DecisionRequest, index: int) -> bool:
        try:
            check_capabilities(self.card, self.asked(request, (index,)))
        except InvalidRequest:
            return False
        return True

    @staticmethod
    def asked(request: DecisionRequest, low: Sequence[int]) -> DecisionRequest:
        """The request the target gets: only the questions re-asked, everything else as sent."""
        return replace(request, questions=tuple(request.questions[i] for i in low), warnings=())

    def request_for(self, request: DecisionRequest, low: Sequence[int]) -> DecisionRequest:
        if self.unready is not None:
            raise NotReady(self.unready)
        return self.asked(request, low)

    def settle(
        self,
        request: DecisionRequest,
        first: DecisionResult,
        low: Sequence[int],
        again: DecisionResult | CanvasreadError | None,
    ) -> DecisionResult:
        """A stage's result: the target's answers in place of the re-asked ones (`again`), else the first
        answers as they are (nothing re-asked, or the target failed with `again`)."""
        if not isinstance(again, DecisionResult):
            return self._kept(first, low, again)
        self.questions += len(low)
        self.spent = self.spent.plus(again.usage)
        return self._merged(request, first, low, again)

    def usage(self) -> dict[str, JSONValue]:
        """`usage.escalation`: the target, the questions it was asked, its tokens (counted in the totals too)."""
        return {
            "model": self.card.name,
            "questions": self.questions,
            "input_tokens": self.spent.input_tokens,
            "output_tokens": self.spent.output_tokens,
        }

    def _merged(
        self, request: DecisionRequest, first: DecisionResult, low: Sequence[int], again: DecisionResult
    ) -> DecisionResult:
        """The first result with the target's answers in place of the re-asked questions (usage: both)."""
        escalated = dict(zip(low, again.distributions, strict=True))
        distributions = []
        for i, (question, read) in enumerate(zip(request.questions, first.distributions, strict=True)):
            if i not in escalated:
                distributions.append(_noted(read, {"answered_by": self.source}))
                continue
            before: dict[str, JSONValue] = {
                "model": self.source,
                "confidence": kind_of(question.kind).confidence(question, read),
            }
            distributions.append(_noted(escalated[i], {"answered_by": self.card.name, "escalated_from": before}))
        return DecisionResult(tuple(distributions), first.usage.plus(again.usage), (*first.warnings, *again.warnings))

    def _kept(self, first: DecisionResult, low: Sequence[int], error: CanvasreadError | None) -> DecisionResult:
        """The first result as it is, each answer saying who answered (and, re-asked in vain, why it stands)."""
        failed: dict[str, JSONValue] = {} if error is None else {"escalation_failed": f"{self.card.name}: {error}"}
        return replace(
            first,
            distributions=tuple(
                _noted(read, {"answered_by": self.source, **(failed if i in low else {})})
                for i, read in enumerate(first.distributions)
            ),
        )


def _noted(read: Distribution, notes: dict[str, JSONValue]) -> Distribution:
    return replace(read, details={**read.details, **notes})
