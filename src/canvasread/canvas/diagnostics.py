"""A canvas job's result: each question's distribution read out by its kind, with the details the reads left.

The details are what `diagnostics: true` shows (where each question was read,
its labels, label mass, entropy, reads, steps, the batch's time, a thought)
and what calibration and the tests look at; the core decides whether the
caller sees them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from canvasread.canvas.job import CanvasJob
from canvasread.canvas.plan import PlannedQuestion
from canvasread.canvas.readout import SlotReading, combine, normalised_entropy
from canvasread.canvas.span_search import SpanSearch
from canvasread.canvas.thinker import thought_details
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.kinds import kind_of
from canvasread.types import DecisionResult, Distribution, JSONValue, Usage


class Diagnostics:
    """Builds results for one read layout (its name is in every question's details) and one tokenizer (thoughts)."""

    def __init__(self, layout_name: str, tokenizer: Tokenizer) -> None:
        self._layout = layout_name
        self._tokenizer = tokenizer

    def result(
        self,
        job: CanvasJob,
        readings: Sequence[list[list[SlotReading]]],
        searches: Mapping[int, SpanSearch],
        elapsed_ms: float,
    ) -> DecisionResult:
        """`readings[q]` holds question q's readings slot by slot; `searches` the span questions' searches."""
        distributions = []
        for q, (planned, question_readings) in enumerate(zip(job.plan.questions, readings, strict=True)):
            if q in searches:
                details: dict[str, JSONValue] = {"canvas": planned.canvas, "layout": self._layout}
                details |= {"steps": searches[q].steps, "batch_ms": elapsed_ms}
                distributions.append(searches[q].distribution(details))
                continue
            distributions.append(self.slot_distribution(job, planned, question_readings, elapsed_ms))
        output_tokens = sum(canvas.text_tokens for canvas in job.plan.canvases)
        usage = Usage(job.plan.prompt_tokens, output_tokens)
        if job.thought is not None:  # the model wrote the thought, then read it with the prompt
            thought = thought_details(job.thought, self._tokenizer)
            distributions = [replace(d, details={**d.details, "thought": thought}) for d in distributions]
            written = len(job.thought.token_ids)
            usage = Usage(usage.input_tokens + written, usage.output_tokens + written)
        return DecisionResult(tuple(distributions), usage)

    def slot_distribution(
        self, job: CanvasJob, planned: PlannedQuestion, readings: Sequence[list[SlotReading]], elapsed_ms: float
    ) -> Distribution:
        """A question's distribution from its slots' readings (each averaged over its reads), read out by its kind.

        One slot reports its labels and the spread of its reads; several (a box's digits) report their positions,
        their mean label mass and the largest entropy among the slots the kind is judged by.
        """
        kind = kind_of(planned.question.kind)
        width = len(job.plan.canvases[planned.canvas].ids)
        combined = [combine(slot_readings) for slot_readings in readings]
        read_out = kind.read_out([c.probabilities for c in combined])
        entropy = max(normalised_entropy(combined[s].probabilities) for s in kind.judged_slots)
        reads, steps = combined[0].reads, job.request.options.steps
        details: dict[str, JSONValue]
        if len(combined) > 1:
            positions: list[JSONValue] = [slot.position for slot in planned.slots]
            details = {"slot": {"canvas": planned.canvas, "positions": positions, "width": width}}
            details |= {"label_mass": sum(c.label_mass for c in combined) / len(combined), "entropy": entropy}
            details |= {"reads": reads, "steps": steps, "batch_ms": elapsed_ms}
            return replace(read_out, details=details, reads=reads)
        [only] = combined
        details = {
            "slot": {"canvas": planned.canvas, "position": planned.position, "width": width},
            "labels": dict(zip(planned.question.option_names, planned.labels, strict=True)),
            "label_mass": only.label_mass,
            "entropy": entropy,
            "reads": reads,
            "layout": self._layout,
            "steps": steps,
            "batch_ms": elapsed_ms,
        }
        if reads > 1:
            details["stderr"] = dict(zip(planned.question.option_names, only.standard_errors, strict=True))
            details["agreement"] = only.agreement
        return replace(read_out, details=details, reads=reads)
