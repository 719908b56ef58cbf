"""What one answered request is (`Decision`, the API's JSON and what the server logs and counts) and what one
stage of it is (`StageAnswers`, what a stream sends)."""

from __future__ import annotations

from dataclasses import dataclass

from canvasread.types import InputWarning, JSONValue


@dataclass(frozen=True)
class Decision:
    """One answered request: what the API returns, plus the timings the server logs."""

    model: str
    answers: dict[str, dict[str, JSONValue]]
    usage: dict[str, int]
    elapsed_s: float
    # Per-question read counts, for backends whose distributions report `reads` (metrics: reads, re-reads).
    reads: tuple[int, ...] = ()
    # Questions not read and why (`canvasread.stages.run`); None when no question has `ask_if`.
    skipped: dict[str, dict[str, JSONValue]] | None = None
    # What the answers do not honour as sent (parsing's and the model's), each once; the key is absent when none.
    warnings: tuple[InputWarning, ...] = ()
    # With escalation on (`canvasread.escalation`): the target, the questions re-asked, the target's tokens.
    escalation: dict[str, JSONValue] | None = None

    def to_json(self) -> dict[str, JSONValue]:
        usage: dict[str, JSONValue] = {**self.usage}
        if self.escalation is not None:
            usage["escalation"] = dict(self.escalation)
        body: dict[str, JSONValue] = {"model": self.model, "answers": dict(self.answers), "usage": usage}
        if self.skipped is not None:
            body["skipped"] = dict(self.skipped)
        if self.warnings:
            body["warnings"] = [warning.to_json() for warning in self.warnings]
        return body


@dataclass(frozen=True)
class StageAnswers:
    """One finished stage, as a stream sends it: its answers in question order and the questions it skipped."""

    number: int
    answers: dict[str, dict[str, JSONValue]]
    skipped: dict[str, dict[str, JSONValue]]
