"""The escalation flags of `canvasread serve` (`canvasread.escalation`): where unsure answers are re-asked."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

import typer

from canvasread.decide import DeciderSettings

ESCALATION = "Escalation"

Target = Annotated[
    str | None,
    typer.Option(
        "--escalate",
        metavar="MODEL",
        rich_help_panel=ESCALATION,
        help="Re-ask unsure answers of this served model (a --model, or an upstream's --upstream-model/-name); "
        "requests choose a threshold with escalate: {below: P} unless --escalate-below sets one.",
    ),
]
Below = Annotated[
    float | None,
    typer.Option(
        metavar="P",
        rich_help_panel=ESCALATION,
        help="Re-ask every answer whose (calibrated) confidence is below P (0-1) of --escalate's model.",
    ),
]


@dataclass(frozen=True)
class EscalationFlags:
    """Where answers a model is unsure of are asked again."""

    escalate: Target = None
    escalate_below: Below = None

    def settings(self, decider: DeciderSettings) -> DeciderSettings:
        return replace(decider, escalate_to=self.escalate, escalate_below=self.escalate_below)
