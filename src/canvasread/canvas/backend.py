"""The canvas backend: answers every question of a request from its canvas reads (one read-only step, or `steps`).

Reads top to bottom like a serving step, each step a small piece of its own:
prepare (`planning.JobPlanner`: labels, prompt, canvases, the seed, every
refusal), think (`thinking.Thinking`: the requests that ask for a thought write
it first), read (`readings.SlotReads`: all label canvases of all requests in
the batch at once, with their re-reads read ahead while few are in flight),
re-read only the uncertain questions with fresh noise
(`rereads.RereadPolicy`), search the span questions' blanks
(`span_search.SpanSearcher`, the first round in the label reads' first call),
answer (`diagnostics.Diagnostics`: read out by
kind, with the details). Every draw is seeded from the request's seed in one
way (`seeds`). Execution is behind a `Reader`, so the in-process engine and
the vLLM proxy share every line here.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.diagnostics import Diagnostics
from canvasread.canvas.job import CanvasJob
from canvasread.canvas.layouts import DEFAULT_LAYOUT, ReadLayout
from canvasread.canvas.plan import CANVAS_TAIL, Planner
from canvasread.canvas.planning import JobPlanner, StoreCapacity, Unreadable
from canvasread.canvas.prompt import ImageTokens
from canvasread.canvas.reader import Reader, ReaderWithCounters, SlotLogProbs, step_label_limit
from canvasread.canvas.readings import Readings, SlotReads, WantedRead
from canvasread.canvas.rereads import RereadPolicy
from canvasread.canvas.span_search import BlankRound, SpanSearcher
from canvasread.canvas.spans import blank_markers
from canvasread.canvas.thinker import Thinker
from canvasread.canvas.thinking import Thinking
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.kinds import KINDS
from canvasread.types import DecisionRequest, DecisionResult, JobCost, ModelCard

# Re-read a question while its averaged label distribution's normalised entropy is above this (1 = uniform).
DEFAULT_REREAD_ENTROPY = 0.5
# `samples: "auto"` reads at most this many times in all.
DEFAULT_MAX_AUTO_READS = 4
# The batches being read hold at most this many canvas tokens of re-reads read ahead (`rereads`), together. On the
# H200 a pass costs about 23 ms plus 0.025 ms a token, so these cost at most a pass's floor where a round costs a
# pass; a `mixed` request's canvas is 64 tokens (1 to 3 canvases), its 3 re-reads 192. Under load the room is
# taken and the rest re-read in rounds, which share other requests' passes, so what is read for nothing stays
# bounded. 1,024 against 512 and a batch read alone: bench/results/h200-2026-12-05/README.md.
DEFAULT_READ_AHEAD_TOKENS = 1024


@dataclass(frozen=True)
class ReadSettings:
    reread_entropy: float = DEFAULT_REREAD_ENTROPY
    max_auto_reads: int = DEFAULT_MAX_AUTO_READS
    read_ahead_tokens: int = DEFAULT_READ_AHEAD_TOKENS
    # The layout the tests and the README describe; the others are there to be compared (`eval --compare`).
    layout: ReadLayout = DEFAULT_LAYOUT

    def __post_init__(self) -> None:
        if not 0.0 <= self.reread_entropy <= 1.0:
            raise ValueError("reread_entropy is a normalised entropy, between 0 and 1")
        if self.max_auto_reads < 1:
            raise ValueError("max_auto_reads must be at least 1")
        if self.read_ahead_tokens < 0:
            raise ValueError("read_ahead_tokens must be 0 (never read ahead) or more")


@dataclass(frozen=True)
class CanvasRuntime:
    """What `load()` produces: how to read (and think, when the runtime can), how to tokenize, the model's sizes.

    `health` says why the runtime cannot answer now (None: it can), for a runtime that can lose what it reads
    through (the vLLM wing's upstreams); it is called on the event loop, so it returns a flag, never blocks.
    `capacity` is the reader's prompt store, for a reader that holds a call's prompts in a bounded one (the
    in-process engine's KV store): requests that cannot fit are refused before they queue (None: no bound).
    `close` stops what the runtime started (threads, connections), for tests and embedders. `batches` is how
    many batches `decide` may read at once over this runtime (the in-process engine merges their reads, re-reads
    and thoughts in one loop's passes; a reader that cannot, one).
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
    capacity: StoreCapacity | None = None
    batches: int = 1


class CanvasBackend:
    """A `Backend` over any `Reader`: an assembly of the pieces the module docstring names, built at `load()`."""

    def __init__(
        self, card: ModelCard, load: Callable[[], CanvasRuntime], settings: ReadSettings = ReadSettings()
    ) -> None:
        self._card = card
        self._load = load
        self.settings = settings
        self._rereads = RereadPolicy(settings.reread_entropy, settings.max_auto_reads)
        self._runtime: CanvasRuntime | None = None
        self._pieces: _Pieces | None = None
        self._counted = {"rereads": 0, "reads_ahead": 0, "reads_ahead_unused": 0}
        self._ahead_in_flight = 0  # canvas tokens of the reads ahead in the batches' first calls, on their threads
        self._count_lock = threading.Lock()

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
        self._pieces = _Pieces.of(runtime, self._card, self.settings.layout)
        self._runtime = runtime

    @property
    def batches_at_once(self) -> int:
        """How many batches `decide` may read at once: the runtime's (`CanvasRuntime.batches`)."""
        return self._runtime.batches if self._runtime is not None else 1

    @property
    def budgets_at_once(self) -> int:
        """One model: the batches in flight hold one batch's budget together."""
        return 1

    def counters(self) -> dict[str, float]:
        reader = self._runtime.reader if self._runtime is not None else None
        counted = dict(reader.counters()) if isinstance(reader, ReaderWithCounters) else {}
        with self._count_lock:
            counted.update((name, float(value)) for name, value in self._counted.items())
        return counted

    def prepare(self, request: DecisionRequest) -> CanvasJob:
        """Plan on the request's own thread, so a request that cannot be read never reaches a batch."""
        return self._loaded().planning.prepare(request)

    def cost(self, job: CanvasJob) -> JobCost:
        return JobPlanner.cost(job)

    def decide(self, jobs: Sequence[CanvasJob], gone: Gone = never_gone) -> list[DecisionResult | None]:
        """Think, first reads of every job at once (the blanks' first round with them), re-read rounds, the rest of
        the span searches, results; a job whose caller has left gets no more rounds and no result, and its reads
        stop between the reader's passes where it can."""
        started = time.monotonic()
        pieces = self._loaded()
        jobs = pieces.thinking.think(jobs, gone)
        searches = pieces.spans.begin(jobs, gone)
        readings = self._read_labels(pieces.slots, jobs, pieces.spans.first_round(searches), gone)
        pieces.spans.finish(searches)
        elapsed_ms = (time.monotonic() - started) * 1000.0
        result = pieces.diagnostics.result
        return [
            None if gone(j) else result(job, readings.by_question(j), searches[j], elapsed_ms)
            for j, job in enumerate(jobs)
        ]

    def _read_labels(self, slots: SlotReads, jobs: Sequence[CanvasJob], blanks: BlankRound, gone: Gone) -> Readings:
        """The first reads and the re-reads read ahead in one call with the blanks' first round, then the re-read
        rounds, each taking the reads it finds fetched (`rereads`' docstring)."""
        readings = Readings(jobs)
        first = self._rereads.first(jobs)
        with self._count_lock:  # the room is shared by the batches being read, on their threads
            ahead = self._rereads.ahead(jobs, self.settings.read_ahead_tokens - self._ahead_in_flight)
            held = RereadPolicy.tokens(jobs, ahead)
            self._ahead_in_flight += held
        try:
            fetched, blank_results = slots.fetch(jobs, [*first, *ahead], gone, blanks.reads)
        finally:
            with self._count_lock:
                self._ahead_in_flight -= held
        blanks.record(blank_results)
        slots.file(jobs, first, fetched, readings)
        asked = self._reread(slots, jobs, fetched, readings, gone)
        with self._count_lock:
            self._counted["reads_ahead"] += len(ahead)
            self._counted["reads_ahead_unused"] += len(set(ahead) - asked)
        return readings

    def _reread(
        self,
        slots: SlotReads,
        jobs: Sequence[CanvasJob],
        fetched: dict[WantedRead, list[SlotLogProbs]],
        readings: Readings,
        gone: Gone,
    ) -> set[WantedRead]:
        """The re-read rounds, reading only what is not `fetched` already; the reads they asked for."""
        asked: set[WantedRead] = set()
        for read in self._rereads.rounds():
            uncertain = self._rereads.uncertain(jobs, readings, gone)
            if not uncertain:
                break
            wanted = self._rereads.again(jobs, uncertain, read)
            fetched.update(slots.fetch(jobs, [w for w in wanted if w not in fetched], gone).labels)
            slots.file(jobs, wanted, fetched, readings, only=uncertain)
            asked.update(wanted)
            with self._count_lock:  # batches run on several threads at once
                self._counted["rereads"] += len(uncertain)
        return asked

    def _loaded(self) -> _Pieces:
        assert self._pieces is not None, "load() first"
        return self._pieces


@dataclass(frozen=True)
class _Pieces:
    """What the backend is assembled from once its runtime has loaded."""

    planning: JobPlanner
    thinking: Thinking
    slots: SlotReads
    spans: SpanSearcher
    diagnostics: Diagnostics

    @classmethod
    def of(cls, runtime: CanvasRuntime, card: ModelCard, layout: ReadLayout) -> _Pieces:
        tokenizer, reader = runtime.tokenizer, runtime.reader
        planner = Planner(
            tokenizer,
            canvas_length=runtime.canvas_length,
            max_positions=runtime.max_positions,
            images=runtime.images,
            layout=layout,
        )
        blanks = {name: kind.blank for name, kind in KINDS.items() if kind.blank is not None}
        markers, unreadable = blank_markers(tokenizer, blanks, CANVAS_TAIL)
        limit = step_label_limit(reader)
        thinking = Thinking(runtime.thinker, tokenizer)
        planning = JobPlanner(planner, thinking, limit, Unreadable(card.name, unreadable), runtime.capacity)
        planning.check_capacity()
        return cls(
            planning,
            thinking,
            SlotReads(reader, tokenizer.vocab_size),
            SpanSearcher(reader, tokenizer.vocab_size, markers, card.capabilities.max_steps, limit),
            Diagnostics(layout.name, tokenizer),
        )
