"""The canvas backend: answers every question of a request from its canvas reads (one read-only step, or `steps`).

Reads top to bottom like a serving step: plan (labels, prompt, canvases),
think (the requests that ask for a thought write it first), read (all
canvases of all requests in the batch at once), read out (label
distributions), re-read only the uncertain questions with fresh noise, answer.
Execution is behind a `Reader`, so the in-process engine and the vLLM proxy
share every line here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.layouts import DEFAULT_LAYOUT, ReadLayout
from canvasread.canvas.plan import CANVAS_TAIL, PlannedCanvas, PlannedQuestion, Planner, ReadPlan, noisy_canvas
from canvasread.canvas.prompt import EncodedPrompt, ImageTokens
from canvasread.canvas.reader import CanvasRead, Reader, ReaderWithCounters, Slot, StepLimitedReader
from canvasread.canvas.readout import SlotReading, combine, needs_another_read, normalised_entropy, slot_reading
from canvasread.canvas.span_search import SpanSearch, search_all
from canvasread.canvas.spans import SPAN_STEPS, Markers, StateTokens, blank_markers
from canvasread.canvas.thinker import (
    Thinker,
    Thought,
    ThoughtChannel,
    think_refusal,
    thought_details,
    with_thought,
)
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.kinds import KINDS, kind_of
from canvasread.kinds.base import as_text
from canvasread.types import (
    DecisionRequest,
    DecisionResult,
    Distribution,
    JobCost,
    JSONValue,
    ModelCard,
    Usage,
)

# Re-read a question while its averaged label distribution's normalised entropy is above this (1 = uniform).
DEFAULT_REREAD_ENTROPY = 0.5
# `samples: "auto"` reads at most this many times in all.
DEFAULT_MAX_AUTO_READS = 4


@dataclass(frozen=True)
class ReadSettings:
    reread_entropy: float = DEFAULT_REREAD_ENTROPY
    max_auto_reads: int = DEFAULT_MAX_AUTO_READS
    # The layout the tests and the README describe; the others are there to be compared (`eval --compare`).
    layout: ReadLayout = DEFAULT_LAYOUT

    def __post_init__(self) -> None:
        if not 0.0 <= self.reread_entropy <= 1.0:
            raise ValueError("reread_entropy is a normalised entropy, between 0 and 1")
        if self.max_auto_reads < 1:
            raise ValueError("max_auto_reads must be at least 1")


@dataclass(frozen=True)
class CanvasRuntime:
    """What `load()` produces: how to read (and think, when the runtime can), how to tokenize, the model's sizes.

    `health` says why the runtime cannot answer now (None: it can), for a runtime that can lose what it reads
    through (the vLLM wing's upstreams); it is called on the event loop, so it returns a flag, never blocks.
    `close` stops what the runtime started (threads, connections), for tests and embedders.
    """

    reader: Reader
    tokenizer: Tokenizer
    canvas_length: int
    max_positions: int | None
    fingerprint: str
    images: ImageTokens | None = None
    thinker: Thinker | None = None
    health: Callable[[], str | None] | None = None
    close: Callable[[], None] | None = None


@dataclass(frozen=True)
class CanvasJob:
    """A planned request; `thought` is filled in by `decide` before the reads when the request asks to think."""

    request: DecisionRequest
    plan: ReadPlan
    seed: int
    # The state's own tokens, for span questions (None when the request has none).
    state: StateTokens | None = None
    thought: Thought | None = None

    def prompt_ids(self, prompt: EncodedPrompt) -> tuple[int, ...]:
        """The ids a read of this job sends: `prompt`'s, with the thought (if any) in its thought block."""
        return prompt.ids if self.thought is None else with_thought(prompt.ids, self.thought)


class CanvasBackend:
    """A `Backend` over any `Reader`; see the module docstring for the flow."""

    def __init__(
        self, card: ModelCard, load: Callable[[], CanvasRuntime], settings: ReadSettings = ReadSettings()
    ) -> None:
        self._card = card
        self._load = load
        self.settings = settings
        self._runtime: CanvasRuntime | None = None
        self._planner: Planner | None = None
        self._markers: dict[str, Markers] = {}
        # Kinds read at a blank that this tokenizer cannot mark, and why (refused; every other kind is read).
        self._unreadable: dict[str, str] = {}
        self._channel: ThoughtChannel | None = None
        self._no_channel = "this model cannot think before it reads"
        self._rereads = 0

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def runtime(self) -> CanvasRuntime | None:
        """What `load()` produced (None before it): the reader, tokenizer and sizes the backend reads with."""
        return self._runtime

    def health_problem(self) -> str | None:
        """The runtime's own health, where it reports one (see `ReportsHealth`); None before `load()`."""
        runtime = self._runtime
        return runtime.health() if runtime is not None and runtime.health is not None else None

    def close(self) -> None:
        """Stop what the runtime started, where it started anything (tests and embedders; the server just exits)."""
        runtime = self._runtime
        if runtime is not None and runtime.close is not None:
            runtime.close()

    @property
    def fingerprint(self) -> str | None:
        """The weights' fingerprint and the read layout together: a layout changes every distribution."""
        if self._runtime is None:
            return None
        material = json.dumps([self._runtime.fingerprint, self.settings.layout.describe()], sort_keys=True)
        return "sha256:" + hashlib.sha256(material.encode()).hexdigest()

    def load(self) -> None:
        runtime = self._load()
        self._planner = Planner(
            runtime.tokenizer,
            canvas_length=runtime.canvas_length,
            max_positions=runtime.max_positions,
            images=runtime.images,
            layout=self.settings.layout,
        )
        blanks = {name: kind.blank for name, kind in KINDS.items() if kind.blank is not None}
        self._markers, self._unreadable = blank_markers(runtime.tokenizer, blanks, CANVAS_TAIL)
        self._channel = ThoughtChannel.of(runtime.tokenizer) if runtime.thinker is not None else None
        if runtime.thinker is not None and self._channel is None:
            self._no_channel = f"this model cannot think before it reads: {ThoughtChannel.missing(runtime.tokenizer)}"
        self._runtime = runtime

    def counters(self) -> dict[str, float]:
        reader = self._runtime.reader if self._runtime is not None else None
        counted = dict(reader.counters()) if isinstance(reader, ReaderWithCounters) else {}
        counted["rereads"] = float(self._rereads)
        return counted

    def prepare(self, request: DecisionRequest) -> CanvasJob:
        """Plan on the request's own thread, so a question that cannot be labelled never reaches a batch."""
        assert self._planner is not None, "prepare() before load()"
        unreadable = [
            FieldProblem(
                ("questions", q.key, q.kind), f"model {self._card.name} cannot answer {q.kind} questions: {why}"
            )
            for q in request.questions
            if (why := self._unreadable.get(q.kind)) is not None
        ]
        if unreadable:
            raise InvalidRequest(unreadable)
        seed = request.options.seed if request.options.seed is not None else secrets.randbits(63)
        plan = self._planner.plan(request)
        state = None
        if any(kind_of(question.kind).blank is not None for question in request.questions):
            state = StateTokens.of(self._planner.tokenizer, as_text(request.state))
        job = CanvasJob(request, plan, seed, state)
        if request.options.think is not None:
            refusal = self._no_channel if self._channel is None else None
            refusal = refusal or think_refusal(request, job.plan, self.settings.layout, self._planner.max_positions)
            if refusal is not None:
                raise InvalidRequest.at(("think",), refusal)
        self._check_step_limit(job)
        return job

    def _check_step_limit(self, job: CanvasJob) -> None:
        """A multi-step read past the reader's label-id limit is refused here, before it queues (blanks read in
        one step past it, see `_span_steps`)."""
        reader = self._runtime.reader if self._runtime is not None else None
        if job.request.options.steps == 1 or not isinstance(reader, StepLimitedReader):
            return
        limit = reader.max_step_label_ids
        for canvas in job.plan.canvases:
            slots = [slot for q in canvas.questions for slot in job.plan.questions[q].slots]
            asked = len({token for slot in slots for token in slot.read_ids})
            if asked > limit:
                raise InvalidRequest.at(
                    ("steps",),
                    f"this model reads a multi-step canvas in one upstream request, which asks at most {limit} label "
                    f"ids (each request denoises on its own); this canvas asks {asked}: ask with steps 1",
                )

    def cost(self, job: CanvasJob) -> JobCost:
        """The prompts plus every canvas of the first reads (all in one pass), and the images' pixels.

        A thought of N tokens adds its own pass (the prompt and N tokens written) and N tokens to the prompt read.
        """
        canvas_tokens = sum(len(canvas.ids) for canvas in job.plan.canvases) * self._initial_reads(job)
        pixels = sum(asset.width * asset.height for asset in job.request.assets.values())
        think = job.request.options.think or 0
        thought_tokens = job.plan.prompt_tokens + 2 * think if think else 0
        return JobCost(job.plan.prompt_tokens + canvas_tokens + thought_tokens, pixels)

    def decide(self, jobs: Sequence[CanvasJob], gone: Gone = never_gone) -> list[DecisionResult | None]:
        """First reads of every job at once, then re-read rounds; a job whose caller has left gets no more rounds."""
        started = time.monotonic()
        jobs = self._think(jobs, gone)
        # readings[job][question][slot]: that slot's reading from every read so far.
        readings: list[list[list[list[SlotReading]]]] = [
            [[[] for _ in planned.slots] for planned in job.plan.questions] for job in jobs
        ]
        first_reads = [
            (j, c, r)
            for j, job in enumerate(jobs)
            for r in range(self._initial_reads(job))
            for c, canvas in enumerate(job.plan.canvases)
            if not _is_blank(job, canvas)
        ]
        self._read(jobs, first_reads, readings, only=None)
        for read_number in range(1, self.settings.max_auto_reads):
            uncertain = {
                (j, q)
                for j, job in enumerate(jobs)
                if job.request.options.samples == "auto" and not gone(j)
                for q, planned in enumerate(job.plan.questions)
                if (kind := kind_of(planned.question.kind)).blank is None
                and any(
                    needs_another_read(
                        readings[j][q][s],
                        entropy_threshold=self.settings.reread_entropy,
                        max_reads=self.settings.max_auto_reads,
                    )
                    for s in kind.judged_slots
                )
            }
            if not uncertain:
                break
            canvases = sorted({(j, jobs[j].plan.questions[q].canvas) for j, q in uncertain})
            again = [(j, c, read_number) for j, c in canvases]
            self._read(jobs, again, readings, only=uncertain)
            self._rereads += len(uncertain)
        searches = self._search_spans(jobs, gone)
        elapsed_ms = (time.monotonic() - started) * 1000.0
        return [
            None if gone(j) else self._result(job, readings[j], searches[j], elapsed_ms) for j, job in enumerate(jobs)
        ]

    def _search_spans(self, jobs: Sequence[CanvasJob], gone: Gone) -> list[dict[int, SpanSearch]]:
        """Every span question of the batch whose caller still waits, searched round by round
        (`canvasread.canvas.span_search`)."""
        runtime = self._runtime
        assert runtime is not None
        found: list[dict[int, SpanSearch]] = []
        for j, job in enumerate(jobs):
            asked = () if gone(j) else job.plan.questions
            searches = (self._span_search(job, planned) for planned in asked)
            found.append({q: search for q, search in enumerate(searches) if search is not None})
        search_all([s for searches in found for s in searches.values()], runtime.reader, runtime.tokenizer.vocab_size)
        return found

    def _span_search(self, job: CanvasJob, planned: PlannedQuestion) -> SpanSearch | None:
        if planned.question.kind not in self._markers or job.state is None:
            return None
        canvas = job.plan.canvases[planned.canvas]
        read = functools.partial(self._blank_read, job, canvas)
        samples = self._initial_reads(job)
        blank = (canvas.ids, planned.position, planned.digest)  # where the blank is, and what seeds its noise
        return SpanSearch(self._markers[planned.question.kind], job.state, *blank, job.seed, samples, read)

    def _span_steps(self, job: CanvasJob) -> int:
        steps = min(max(job.request.options.steps, SPAN_STEPS), self._card.capabilities.max_steps)
        reader = self._runtime.reader if self._runtime is not None else None
        # A blank asks the state's distinct ids and at most two markers: past a reader's multi-step limit, one step.
        state = job.state
        if isinstance(reader, StepLimitedReader) and state is not None:
            return 1 if len(state.distinct_ids) + 2 > reader.max_step_label_ids else steps
        return steps

    def _blank_read(
        self, job: CanvasJob, canvas: PlannedCanvas, canvas_ids: tuple[int, ...], slots: tuple[Slot, ...]
    ) -> CanvasRead:
        """A blank's read: at least `SPAN_STEPS` steps (the request's `steps` when more), as many as the model can.

        Its noise already differs from read to read and round to round, so it seeds the steps' draws.
        """
        prompt = job.plan.prompt(canvas)
        steps, seed = self._span_steps(job), _step_seed(job.seed, 0, canvas_ids)
        return CanvasRead(job.prompt_ids(prompt), prompt.prefix_length, canvas_ids, slots, prompt.images, steps, seed)

    def _think(self, jobs: Sequence[CanvasJob], gone: Gone) -> list[CanvasJob]:
        """The jobs, each that asks to think with its thought: one thinker call for the batch, before any read.

        A job whose caller has gone before its thought is written writes none (its result is dropped anyway).
        """
        wanting = [j for j, job in enumerate(jobs) if job.request.options.think is not None and job.thought is None]
        if not wanting:
            return list(jobs)
        runtime, channel = self._runtime, self._channel
        assert runtime is not None and runtime.thinker is not None and channel is not None, "prepare() checks think"
        prompts = {j: jobs[j].plan.prompts[0] for j in wanting}
        requests = [channel.request(prompts[j].ids, jobs[j].request.options.think or 0, jobs[j].seed, prompts[j].images)
                    for j in wanting]  # fmt: skip
        written = runtime.thinker.think(requests, lambda i: gone(wanting[i]))
        thought = {j: t for j, t in zip(wanting, written, strict=True) if t is not None}
        return [replace(job, thought=thought[j]) if j in thought else job for j, job in enumerate(jobs)]

    @staticmethod
    def _initial_reads(job: CanvasJob) -> int:
        samples = job.request.options.samples
        return 1 if samples == "auto" else samples

    def _read(
        self,
        jobs: Sequence[CanvasJob],
        wanted: Sequence[tuple[int, int, int]],
        readings: list[list[list[list[SlotReading]]]],
        only: set[tuple[int, int]] | None,
    ) -> None:
        """Read (job, canvas, read number) triples in one reader call and file the slots' readings."""
        runtime = self._runtime
        assert runtime is not None
        reads = [
            self._canvas_read(jobs[j], jobs[j].plan.canvases[c], r, runtime.tokenizer.vocab_size) for j, c, r in wanted
        ]
        for (j, c, _), slots in zip(wanted, runtime.reader.read(reads), strict=True):
            results = iter(slots)
            for q in jobs[j].plan.canvases[c].questions:
                for s, slot in enumerate(jobs[j].plan.questions[q].slots):
                    logprobs = next(results)
                    if only is None or (j, q) in only:
                        readings[j][q][s].append(slot_reading(*slot.split(logprobs.label_logprobs)))

    @staticmethod
    def _canvas_read(job: CanvasJob, canvas: PlannedCanvas, read: int, vocab_size: int) -> CanvasRead:
        questions = job.plan.questions
        ids = noisy_canvas(canvas, questions, vocab_size=vocab_size, seed=job.seed, read=read)
        slots = tuple(Slot(slot.position, slot.read_ids) for q in canvas.questions for slot in questions[q].slots)
        steps = job.request.options.steps
        seed = _step_seed(job.seed, read, ids)
        prompt = job.plan.prompt(canvas)
        return CanvasRead(job.prompt_ids(prompt), prompt.prefix_length, ids, slots, prompt.images, steps, seed)

    def _result(
        self,
        job: CanvasJob,
        readings: list[list[list[SlotReading]]],
        searches: dict[int, SpanSearch],
        elapsed_ms: float,
    ) -> DecisionResult:
        distributions = []
        for q, (planned, question_readings) in enumerate(zip(job.plan.questions, readings, strict=True)):
            canvas = job.plan.canvases[planned.canvas]
            if q in searches:
                details: dict[str, JSONValue] = {"canvas": planned.canvas, "layout": self.settings.layout.name}
                details |= {"steps": self._span_steps(job), "batch_ms": elapsed_ms}
                distributions.append(searches[q].distribution(details))
                continue
            distributions.append(self._slot_distribution(job, planned, question_readings, len(canvas.ids), elapsed_ms))
        output_tokens = sum(canvas.text_tokens for canvas in job.plan.canvases)
        usage = Usage(job.plan.prompt_tokens, output_tokens)
        if job.thought is not None:  # the model wrote the thought, then read it with the prompt
            assert self._runtime is not None
            thought = thought_details(job.thought, self._runtime.tokenizer)
            distributions = [replace(d, details={**d.details, "thought": thought}) for d in distributions]
            written = len(job.thought.token_ids)
            usage = Usage(usage.input_tokens + written, usage.output_tokens + written)
        return DecisionResult(tuple(distributions), usage)

    def _slot_distribution(
        self,
        job: CanvasJob,
        planned: PlannedQuestion,
        readings: list[list[SlotReading]],
        width: int,
        elapsed_ms: float,
    ) -> Distribution:
        """A question's distribution from its slots' readings (each averaged over its reads), read out by its kind.

        One slot reports its labels and the spread of its reads; several (a box's digits) report their positions,
        their mean label mass and the largest entropy among the slots the kind is judged by.
        """
        kind = kind_of(planned.question.kind)
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
            "layout": self.settings.layout.name,
            "steps": steps,
            "batch_ms": elapsed_ms,
        }
        if reads > 1:
            details["stderr"] = dict(zip(planned.question.option_names, only.standard_errors, strict=True))
            details["agreement"] = only.agreement
        return replace(read_out, details=details, reads=reads)


def _step_seed(seed: int, read: int, canvas_ids: Sequence[int]) -> int:
    """The seed of a multi-step read's random draws: the request's seed, the read number and the noisy canvas."""
    material = json.dumps([seed, read, list(canvas_ids)])
    return int.from_bytes(hashlib.sha256(material.encode()).digest()[:8], "big") >> 1


def _is_blank(job: CanvasJob, canvas: PlannedCanvas) -> bool:
    """A span question's canvas: read by the span search, not as label slots."""
    return kind_of(job.plan.questions[canvas.questions[0]].question.kind).blank is not None
