"""The canvas backend: answers every question of a request from one read-only denoising step.

Reads top to bottom like a serving step: plan (labels, prompt, canvases),
read (all canvases of all requests in the batch at once), read out (label
distributions), re-read only the uncertain questions with fresh noise, answer.
Execution is behind a `Reader`, so the in-process engine and the vLLM proxy
share every line here.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from canvasread.plan import ImageTokens, PlannedCanvas, Planner, ReadPlan, noisy_canvas
from canvasread.readers.base import CanvasRead, Reader, ReaderWithCounters, Slot
from canvasread.readout import SlotReading, combine, needs_another_read, normalised_entropy, slot_reading
from canvasread.tokenizer import Tokenizer
from canvasread.types import (
    Capabilities,
    DecisionRequest,
    DecisionResult,
    Distribution,
    JSONValue,
    ModelCard,
    Usage,
)

# Re-read a question while its averaged label distribution's normalised entropy is above this (1 = uniform).
DEFAULT_REREAD_ENTROPY = 0.5
# `samples: "auto"` reads at most this many times in all.
DEFAULT_MAX_AUTO_READS = 4


@dataclass(frozen=True)
class ReadConfig:
    reread_entropy: float = DEFAULT_REREAD_ENTROPY
    max_auto_reads: int = DEFAULT_MAX_AUTO_READS

    def __post_init__(self) -> None:
        if not 0.0 <= self.reread_entropy <= 1.0:
            raise ValueError("reread_entropy is a normalised entropy, between 0 and 1")
        if self.max_auto_reads < 1:
            raise ValueError("max_auto_reads must be at least 1")


@dataclass(frozen=True)
class CanvasRuntime:
    """What `load()` produces: how to read, how to tokenize, and the model's sizes."""

    reader: Reader
    tokenizer: Tokenizer
    canvas_length: int
    max_positions: int | None
    fingerprint: str
    images: ImageTokens | None = None


@dataclass(frozen=True)
class CanvasJob:
    request: DecisionRequest
    plan: ReadPlan
    seed: int


class CanvasBackend:
    """A `Backend` over any `Reader`; see the module docstring for the flow."""

    def __init__(self, card: ModelCard, load: Callable[[], CanvasRuntime], config: ReadConfig = ReadConfig()) -> None:
        self._card = card
        self._load = load
        self.config = config
        self._runtime: CanvasRuntime | None = None
        self._planner: Planner | None = None
        self._rereads = 0

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def fingerprint(self) -> str | None:
        return self._runtime.fingerprint if self._runtime is not None else None

    def load(self) -> None:
        runtime = self._load()
        self._planner = Planner(
            runtime.tokenizer,
            canvas_length=runtime.canvas_length,
            max_positions=runtime.max_positions,
            images=runtime.images,
        )
        self._runtime = runtime

    def counters(self) -> dict[str, float]:
        reader = self._runtime.reader if self._runtime is not None else None
        counted = dict(reader.counters()) if isinstance(reader, ReaderWithCounters) else {}
        counted["rereads"] = float(self._rereads)
        return counted

    def prepare(self, request: DecisionRequest) -> CanvasJob:
        """Plan on the request's own thread, so a question that cannot be labelled never reaches a batch."""
        assert self._planner is not None, "prepare() before load()"
        seed = request.policy.seed if request.policy.seed is not None else secrets.randbits(63)
        return CanvasJob(request, self._planner.plan(request), seed)

    def decide(self, jobs: Sequence[CanvasJob]) -> list[DecisionResult]:
        started = time.monotonic()
        readings: list[list[list[SlotReading]]] = [[[] for _ in job.plan.questions] for job in jobs]
        first_reads = [
            (j, c, r)
            for j, job in enumerate(jobs)
            for r in range(self._initial_reads(job))
            for c in range(len(job.plan.canvases))
        ]
        self._read(jobs, first_reads, readings, only=None)
        for read_number in range(1, self.config.max_auto_reads):
            uncertain = {
                (j, q)
                for j, job in enumerate(jobs)
                if job.request.policy.samples == "auto"
                for q in range(len(job.plan.questions))
                if needs_another_read(
                    readings[j][q], entropy_threshold=self.config.reread_entropy, max_reads=self.config.max_auto_reads
                )
            }
            if not uncertain:
                break
            canvases = sorted({(j, jobs[j].plan.questions[q].canvas) for j, q in uncertain})
            again = [(j, c, read_number) for j, c in canvases]
            self._read(jobs, again, readings, only=uncertain)
            self._rereads += len(uncertain)
        elapsed_ms = (time.monotonic() - started) * 1000.0
        return [self._result(job, readings[j], elapsed_ms) for j, job in enumerate(jobs)]

    @staticmethod
    def _initial_reads(job: CanvasJob) -> int:
        samples = job.request.policy.samples
        return 1 if samples == "auto" else samples

    def _read(
        self,
        jobs: Sequence[CanvasJob],
        wanted: Sequence[tuple[int, int, int]],
        readings: list[list[list[SlotReading]]],
        only: set[tuple[int, int]] | None,
    ) -> None:
        """Read (job, canvas, read number) triples in one reader call and file the slots' readings."""
        runtime = self._runtime
        assert runtime is not None
        reads = [
            self._canvas_read(jobs[j], jobs[j].plan.canvases[c], r, runtime.tokenizer.vocab_size) for j, c, r in wanted
        ]
        for (j, c, _), slots in zip(wanted, runtime.reader.read(reads), strict=True):
            for q, logprobs in zip(jobs[j].plan.canvases[c].questions, slots, strict=True):
                if only is None or (j, q) in only:
                    readings[j][q].append(slot_reading(logprobs.label_logprobs))

    @staticmethod
    def _canvas_read(job: CanvasJob, canvas: PlannedCanvas, read: int, vocab_size: int) -> CanvasRead:
        questions = job.plan.questions
        ids = noisy_canvas(canvas, questions, vocab_size=vocab_size, seed=job.seed, read=read)
        slots = tuple(Slot(questions[q].position, questions[q].label_ids) for q in canvas.questions)
        return CanvasRead(job.plan.prompt_ids, job.plan.prefix_length, ids, slots, job.plan.images)

    @staticmethod
    def _result(job: CanvasJob, readings: list[list[SlotReading]], elapsed_ms: float) -> DecisionResult:
        distributions = []
        for planned, question_readings in zip(job.plan.questions, readings, strict=True):
            combined = combine(question_readings)
            canvas = job.plan.canvases[planned.canvas]
            details: dict[str, JSONValue] = {
                "slot": {"canvas": planned.canvas, "position": planned.position, "width": len(canvas.ids)},
                "labels": dict(zip(planned.question.option_names, planned.labels, strict=True)),
                "label_mass": combined.label_mass,
                "entropy": normalised_entropy(combined.probabilities),
                "reads": combined.reads,
                "batch_ms": elapsed_ms,
            }
            if combined.reads > 1:
                details["stderr"] = dict(zip(planned.question.option_names, combined.standard_errors, strict=True))
                details["agreement"] = combined.agreement
            distributions.append(Distribution(combined.probabilities, details))
        output_tokens = sum(canvas.text_tokens for canvas in job.plan.canvases)
        return DecisionResult(tuple(distributions), Usage(len(job.plan.prompt_ids), output_tokens))


@dataclass(frozen=True)
class EngineSettings:
    """How an in-process checkpoint is run (the `serve` flags for DiffusionGemma)."""

    device: str | None = None
    dtype: str | None = None
    experts: str | None = None
    random_init_std: float | None = None
    naive: bool = False
    cuda_graphs: bool = True
    cache_bytes: int = 2 << 30
    max_rows: int = 256


def canvas_backend_for_checkpoint(
    spec: str, settings: EngineSettings = EngineSettings(), config: ReadConfig = ReadConfig()
) -> CanvasBackend:
    """An in-process DiffusionGemma backend; nothing heavy happens until `load()`.

    With `settings.naive` it reads through plain transformers forwards instead
    of the fused engine (the benchmark baseline), under the name `<model>-naive`.
    """
    name = spec.rstrip("/").rsplit("/", 1)[-1] + ("-naive" if settings.naive else "")
    how = "plain transformers forwards (naive baseline)" if settings.naive else "the fused in-process engine"
    card = ModelCard(
        name=name,
        description=f"DiffusionGemma checkpoint {spec} read through {how}: one read-only denoising step per "
        "request, label slots read as distributions.",
        release_date=time.strftime("%Y-%m-%d"),
        capabilities=Capabilities(images=not settings.naive and _may_see_images(spec), max_options=255, max_levels=10),
    )

    def load() -> CanvasRuntime:
        from canvasread.engine.loader import load_checkpoint
        from canvasread.engine.naive import NaiveReader
        from canvasread.engine.reader import InProcessReader
        from canvasread.engine.runner import FusedRunner
        from canvasread.tokenizer import HFTokenizer

        loaded = load_checkpoint(
            spec,
            device=settings.device,
            dtype=settings.dtype,
            experts=settings.experts,
            random_init_std=settings.random_init_std,
        )
        text_config = loaded.model.config.text_config
        runner = FusedRunner(loaded.model, cuda_graphs=settings.cuda_graphs, image_processor=loaded.image_processor)
        reader: Reader = (
            NaiveReader(loaded.model)
            if settings.naive
            else InProcessReader(runner, cache_bytes=settings.cache_bytes, max_rows=settings.max_rows)
        )
        config = loaded.model.config
        images = None
        if loaded.image_processor is not None and not settings.naive:
            images = ImageTokens(
                int(config.boi_token_id), int(config.image_token_id), int(config.eoi_token_id), runner.image_token_count
            )
        return CanvasRuntime(
            reader=reader,
            tokenizer=HFTokenizer(loaded.tokenizer),
            canvas_length=int(loaded.model.config.canvas_length),
            max_positions=int(text_config.max_position_embeddings),
            fingerprint=loaded.fingerprint,
            images=images,
        )

    return CanvasBackend(card, load, config)


def _may_see_images(spec: str) -> bool:
    """A local checkpoint sees images when it ships an image processor config; a hub id is assumed to."""
    folder = Path(spec)
    return not folder.is_dir() or (folder / "preprocessor_config.json").exists()
