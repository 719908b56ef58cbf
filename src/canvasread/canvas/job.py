"""`CanvasJob`: one request as the canvas backend carries it from `prepare` to its answer.

Plain data, so every piece of the backend (planning, thinking, reads, span
search, diagnostics) reads the same job and none of them calls another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from canvasread.canvas.plan import PlannedCanvas, ReadPlan
from canvasread.canvas.prompt import EncodedPrompt
from canvasread.canvas.spans import StateTokens
from canvasread.canvas.thinker import Thought, with_thought
from canvasread.kinds import kind_of
from canvasread.types import DecisionRequest


@dataclass(frozen=True)
class CanvasJob:
    """A planned request; `thought` is filled in by `decide` before the reads when the request asks to think.

    `seed` is the root of every draw its reads make (`canvasread.canvas.seeds`).
    """

    request: DecisionRequest
    plan: ReadPlan
    seed: int
    # The state's own tokens, for span questions (None when the request has none).
    state: StateTokens | None = None
    thought: Thought | None = None

    @property
    def first_reads(self) -> int:
        """How many times each canvas is read at first: `samples`, or once for "auto" (which may read again)."""
        samples = self.request.options.samples
        return 1 if samples == "auto" else samples

    def read_prompt(self, canvas: PlannedCanvas) -> EncodedPrompt:
        """The prompt `canvas` is read against, with the thought (if any) in its thought block."""
        prompt = self.plan.prompt(canvas)
        return prompt if self.thought is None else replace(prompt, ids=with_thought(prompt.ids, self.thought))

    @property
    def label_canvases(self) -> list[int]:
        """The canvases read as label slots, by index: every one but the span questions' blanks."""
        return [c for c, canvas in enumerate(self.plan.canvases) if not self.is_blank(canvas)]

    def is_blank(self, canvas: PlannedCanvas) -> bool:
        """A span question's canvas: read by the span search, not as label slots."""
        return kind_of(self.plan.questions[canvas.questions[0]].question.kind).blank is not None
