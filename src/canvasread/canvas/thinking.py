"""Thinking before the reads: whether a request may think, and one thinker call that writes a batch's thoughts.

The protocol, the thought channel and the splice into the prompt are in
`canvasread.canvas.thinker`; this is the piece of the canvas backend that uses
them, built once per loaded runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.layouts import ReadLayout
from canvasread.canvas.plan import ReadPlan
from canvasread.canvas.thinker import Thinker, ThoughtChannel, think_refusal
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.types import DecisionRequest


class Thinking:
    """A runtime's thinker (None: it cannot think) with its tokenizer's thought channel."""

    def __init__(self, thinker: Thinker | None, tokenizer: Tokenizer) -> None:
        self._thinker = thinker
        self._channel = ThoughtChannel.of(tokenizer) if thinker is not None else None
        self._cannot = "this model cannot think before it reads"
        if thinker is not None and self._channel is None:
            self._cannot += f": {ThoughtChannel.missing(tokenizer)}"

    @property
    def can_think(self) -> bool:
        return self._thinker is not None and self._channel is not None

    def refusal(
        self, request: DecisionRequest, plan: ReadPlan, layout: ReadLayout, max_positions: int | None
    ) -> str | None:
        """Why this request's `think` cannot be honoured here (None: it can, or it does not ask to think)."""
        if request.options.think is None:
            return None
        if not self.can_think:
            return self._cannot
        return think_refusal(request, plan, layout, max_positions)

    def think(self, jobs: Sequence[CanvasJob], gone: Gone = never_gone) -> list[CanvasJob]:
        """The jobs, each that asks to think with its thought: one thinker call for the batch, before any read.

        A job whose caller has gone before its thought is written writes none (its result is dropped anyway).
        """
        wanting = [j for j, job in enumerate(jobs) if job.request.options.think is not None and job.thought is None]
        if not wanting:
            return list(jobs)
        thinker, channel = self._thinker, self._channel
        assert thinker is not None and channel is not None, "prepare() refuses think where the model cannot"
        prompts = {j: jobs[j].plan.prompts[0] for j in wanting}
        requests = [channel.request(prompts[j], jobs[j].request.options.think or 0, jobs[j].seed) for j in wanting]
        written = thinker.think(requests, lambda i: gone(wanting[i]))
        thought = {j: t for j, t in zip(wanting, written, strict=True) if t is not None}
        return [replace(job, thought=thought[j]) if j in thought else job for j, job in enumerate(jobs)]
