"""`Decider`: from a validated request to Jev-shaped answers, around whichever backend serves the model.

Reads top to bottom like the request does: resolve the model, check the
request against the backend's capabilities, then stage by stage (questions
that wait on others' answers come later; see `canvasread.stages`) expand
option rotations, queue the stage for a batch, fold the rotations back,
calibrate, turn the distributions into answers. No HTTP and no torch here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from canvasread.answers import build_answer
from canvasread.backends.base import AnyBackend, HasFingerprint, ReadsBatchesAtOnce
from canvasread.batching import BatchSettings
from canvasread.calibration import Calibration, calibrate
from canvasread.capabilities import check_capabilities
from canvasread.decision import Decision, StageAnswers
from canvasread.errors import CalibrationMismatch, CanvasreadError, DeadlineExceeded, ModelNotFound, NotReady
from canvasread.escalation import Escalation, check_threshold, chosen
from canvasread.preparing import DEFAULT_PREPARE_WORKERS
from canvasread.rotation import plan_rotations
from canvasread.served import ServedModel
from canvasread.stages.run import DEFAULT_MAX_CONTEXT_BYTES, Stage, StageRun
from canvasread.types import DecisionRequest, DecisionResult, Distribution, JSONValue, ModelCard, Question, Usage
from canvasread.wire import parse_request

logger = logging.getLogger(__name__)

# The default model also answers to these: its own aliases, the hosted API's names that clients pin (jev-1.14.0 for
# box), and the local preset of CLI tools that talk to any Jev server (openjev-latest).
DEFAULT_ALIASES = (
    "jev-latest",
    "default",
    "jev-1.14.0",
    "jev-1.14",
    "jev-1.13.0",
    "jev-1.13",
    "jev-preview",
    "openjev-latest",
)
# Routers put a provider before the model name (`typesafe/jev-latest`, `~typesafe/jev-1.13`); it is dropped.
PROVIDER_PREFIXES = ("~typesafe/", "typesafe/")


@dataclass(frozen=True)
class DeciderSettings:
    """What the operator sets for every served model: rounding, batching, the deadline, extra model names, and
    what `depends_on` may write into one request (`serve` sets it to `--max-body-bytes`).

    `aliases` are (name, model) pairs (`serve --alias NAME=MODEL`); a name may
    replace a built-in alias (say `jev-preview`) but not a served model's name.
    """

    decimals: int | None = None
    batch: BatchSettings = BatchSettings()
    timeout_s: float | None = 120.0
    aliases: tuple[tuple[str, str], ...] = ()
    max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES
    prepare_workers: int = DEFAULT_PREPARE_WORKERS
    # `serve --escalate TARGET --escalate-below P` (`canvasread.escalation`); a request's `escalate` overrides.
    escalate_to: str | None = None
    escalate_below: float | None = None

    def __post_init__(self) -> None:
        if self.decimals is not None and self.decimals < 1:
            raise ValueError(
                "--round must be at least 1, the digits kept after the point (leave it out to keep them all)"
            )
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError("--timeout must be positive")
        check_threshold(self.escalate_below, "--escalate-below")
        if self.escalate_below is not None and self.escalate_to is None:
            raise ValueError("--escalate-below needs --escalate TARGET: the model to re-ask")
        names = [name for name, _ in self.aliases]
        if any(not name.strip() or not model.strip() for name, model in self.aliases):
            raise ValueError("an alias needs a name and a model: --alias NAME=MODEL")
        if len(set(names)) != len(names):
            raise ValueError(f"an alias is given twice: {sorted({n for n in names if names.count(n) > 1})}")


class DecisionRun:
    """One request answered stage by stage (see `canvasread.stages`); without `depends_on` and `ask_if` a
    request is one stage, read exactly as before.

    Each stage is one pass through the backend (one batched read, its rotations included), then calibration
    and answers, so later stages see the answers the caller sees. Iterate `stages()` on the event loop
    (through the batch queue, within one deadline for the whole request) or `stages_now()` in the calling
    thread, then take `decision()`. Stopping the iteration early reads no further stage.
    """

    def __init__(
        self,
        served: ServedModel,
        request: DecisionRequest,
        settings: DeciderSettings,
        escalation: Escalation[ServedModel] | None = None,
    ) -> None:
        self._served = served
        self._escalation = escalation
        self._settings = settings
        self._started = time.monotonic()
        self._plan = StageRun(request, settings.max_context_bytes)  # checks references and sizes before any work
        self._answers: dict[str, dict[str, JSONValue]] = {}
        self._usage = Usage()
        self._reads: list[int] = []
        self._warnings = dict.fromkeys(request.warnings)  # an ordered set: each stage may repeat the model's

    async def stages(self) -> AsyncIterator[StageAnswers]:
        while (stage := await self._next_stage()) is not None:
            yield self._record(stage, await self._answered(stage.request) if stage.request.questions else None)

    async def _next_stage(self) -> Stage | None:
        """Writing earlier answers into later questions is work: off the loop. A request of one stage has none, and
        a thread hop costs it more than the step (each hop waits for the interpreter lock behind the loop's work)."""
        if self._plan.staged:
            return await asyncio.to_thread(self._plan.next_stage)
        return self._plan.next_stage()

    def stages_now(self) -> Iterator[StageAnswers]:
        while (stage := self._plan.next_stage()) is not None:
            yield self._record(stage, self._answered_now(stage.request) if stage.request.questions else None)

    async def _answered(self, request: DecisionRequest) -> DecisionResult:
        """The stage's calibrated answers, those its model is unsure of re-asked (`canvasread.escalation`)."""
        result = await self._read(self._served, request)
        if (escalation := self._escalation) is None or not (low := escalation.low(request, result)):
            return result if escalation is None else escalation.settle(request, result, (), None)
        try:
            again = await self._read(escalation.target, escalation.request_for(request, low))
        except CanvasreadError as error:
            return escalation.settle(request, result, low, error)
        return escalation.settle(request, result, low, again)

    def _answered_now(self, request: DecisionRequest) -> DecisionResult:
        result = self._read_now(self._served, request)
        if (escalation := self._escalation) is None or not (low := escalation.low(request, result)):
            return result if escalation is None else escalation.settle(request, result, (), None)
        try:
            again = self._read_now(escalation.target, escalation.request_for(request, low))
        except CanvasreadError as error:
            return escalation.settle(request, result, low, error)
        return escalation.settle(request, result, low, again)

    @staticmethod
    def _read_now(served: ServedModel, request: DecisionRequest) -> DecisionResult:
        backend = served.backend
        rotations = plan_rotations(request)
        [read] = backend.decide([backend.prepare(rotations.request)])
        assert read is not None, "a synchronous caller never leaves, so no job is left off"
        return _calibrated(served.calibration, request, rotations.fold(read))

    async def _read(self, served: ServedModel, request: DecisionRequest) -> DecisionResult:
        rotations = plan_rotations(request)
        work = functools.partial(served.backend.prepare, rotations.request)
        prepare = functools.partial(served.preparing.run, work)
        limit = self._settings.timeout_s
        try:
            left = None if limit is None else self._started + limit - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            result = await asyncio.wait_for(served.queue_for(request).submit(prepare), left)
        except TimeoutError:
            raise DeadlineExceeded(f"no answer within {limit:g}s (--timeout); the request was dropped") from None
        return _calibrated(served.calibration, request, rotations.fold(result))

    def _record(self, stage: Stage, result: DecisionResult | None) -> StageAnswers:
        answers = {}
        if result is not None:
            for question, distribution in zip(stage.request.questions, result.distributions, strict=True):
                self._plan.record(question.key, distribution)
                answers[question.key] = self._answer(question, distribution, stage.number)
                if distribution.reads is not None:
                    self._reads.append(distribution.reads)
            self._warnings.update(dict.fromkeys(result.warnings))
            self._usage = self._usage.plus(result.usage)
        self._answers.update(answers)
        return StageAnswers(stage.number, answers, stage.skipped)

    def _answer(self, question: Question, distribution: Distribution, stage: int) -> dict[str, JSONValue]:
        details = None
        if self._plan.request.options.diagnostics:
            details = {**distribution.details, "stage": stage} if self._plan.staged else distribution.details
        return build_answer(question, distribution, decimals=self._settings.decimals, diagnostics=details)

    def decision(self) -> Decision:
        """The whole answer, in question order; call after the stages are read."""
        keys = [question.key for question in self._plan.request.questions]
        answers = {key: self._answers[key] for key in keys if key in self._answers}
        skipped = {key: self._plan.skipped[key] for key in keys if key in self._plan.skipped}
        usage = {"input_tokens": self._usage.input_tokens, "output_tokens": self._usage.output_tokens}
        elapsed, kept = time.monotonic() - self._started, skipped if self._plan.conditional else None
        escalation = None if self._escalation is None else self._escalation.usage()
        reads, warnings = tuple(self._reads), (*self._warnings,)
        return Decision(self._served.card.name, answers, usage, elapsed, reads, kept, warnings, escalation)


def _calibrated(calibration: Calibration | None, request: DecisionRequest, result: DecisionResult) -> DecisionResult:
    """A read's distributions through the model's calibration, in question order."""
    pairs = zip(request.questions, result.distributions, strict=True)
    return replace(result, distributions=tuple(calibrate(calibration, q, d) for q, d in pairs))


class Decider:
    """Serves one or more backends; the first is the default behind the `jev-latest` and `default` aliases."""

    def __init__(self, backends: Sequence[AnyBackend], settings: DeciderSettings = DeciderSettings()) -> None:
        if not backends:
            raise ValueError("a Decider needs at least one backend")
        self.settings = settings
        self._models: dict[str, ServedModel] = {}
        for backend in backends:
            name = backend.card.name
            if name in self._models or name in DEFAULT_ALIASES:
                raise ValueError(f"two served models are both called {name!r}")
            self._models[name] = ServedModel.of(backend, settings.batch, settings.prepare_workers)
        self.default_name = backends[0].card.name
        self._aliases = self._alias_map(settings.aliases)
        if settings.escalate_to is not None:
            try:
                self.resolve(settings.escalate_to)
            except ModelNotFound as error:
                raise ValueError(f"--escalate {settings.escalate_to}: {error}") from None

    def _alias_map(self, extra: Sequence[tuple[str, str]]) -> dict[str, str]:
        """Alias → served model name; an extra alias may point at a served model or at another alias."""
        aliases = dict.fromkeys(DEFAULT_ALIASES, self.default_name)
        for name, model in extra:
            if name in self._models:
                raise ValueError(f"alias {name!r} is the name of a served model")
            target = model if model in self._models else aliases.get(model)
            if target is None:
                known = ", ".join([*self._models, *aliases])
                raise ValueError(f"alias {name!r} points at {model!r}, which is neither served nor an alias ({known})")
            aliases[name] = target
        return aliases

    def _names(self) -> str:
        return ", ".join([*self._models, *self._aliases])

    # ---- models -------------------------------------------------------------------------
    @property
    def served(self) -> list[ServedModel]:
        return list(self._models.values())

    def model_cards(self) -> list[ModelCard]:
        """Served models, then every alias (listed as models, as the hosted API does)."""
        cards = [served.card for served in self._models.values()]
        for alias, target in self._aliases.items():
            card = self._models[target].card
            cards.append(
                ModelCard(alias, f"Alias of {card.name}. {card.description}", card.release_date, card.capabilities)
            )
        return cards

    def resolve(self, name: str) -> ServedModel:
        """A served name or alias, with or without a provider prefix; else 400 naming what is served."""
        bare = next((name.removeprefix(prefix) for prefix in PROVIDER_PREFIXES if name.startswith(prefix)), name)
        for candidate in (name, bare):
            served = self._models.get(self._aliases.get(candidate, candidate))
            if served is not None:
                return served
        raise ModelNotFound(f"Unknown model: {name}. Served models and aliases: {self._names()}")

    def use_calibration(self, calibration: Calibration) -> None:
        """Apply `calibration` to every answer of the model it was fit for; refuse it for any other model.

        The weights are checked now when the backend knows its fingerprint
        before loading, else right after it loads (a mismatch is then a load failure).
        """
        served = self._models.get(calibration.model)
        if served is None:
            raise CalibrationMismatch(
                f"the calibration was fit for {calibration.model!r}, which is not served here "
                f"(served: {', '.join(self._models)}); fit one for the served model with `canvasread calibrate`"
            )
        backend = served.backend
        unknown_yet = isinstance(backend, HasFingerprint) and backend.fingerprint is None and not served.loaded.is_set()
        if not unknown_yet:
            self._check_calibration(served, calibration)
        served.calibration = calibration

    @staticmethod
    def _check_calibration(served: ServedModel, calibration: Calibration | None) -> None:
        if calibration is None:
            return
        fingerprint = served.backend.fingerprint if isinstance(served.backend, HasFingerprint) else None
        if fingerprint is None:
            raise CalibrationMismatch(f"{served.card.name} has no fingerprint, so no calibration can be checked")
        if fingerprint != calibration.fingerprint:
            raise CalibrationMismatch(
                f"the calibration was fit for {calibration.model} with fingerprint {calibration.fingerprint}, "
                f"but the served weights/config have {fingerprint}; refit it with `canvasread calibrate`"
            )

    # ---- lifecycle ----------------------------------------------------------------------
    def load(self) -> None:
        """Load every backend not loaded yet (slow; run it in a thread). A failure is kept and reported by `ready`.
        A loaded one is left alone: the server's start-up loads the decider it was given, which a library caller
        may have loaded already (`open_decider`), and a second load of an engine would hold a second copy of the
        model and capture its graphs while the first copy's passes run."""
        for served in self._models.values():
            if served.loaded.is_set():
                continue
            started = time.monotonic()
            try:
                served.backend.load()
                self._check_calibration(served, served.calibration)
                if isinstance(served.backend, ReadsBatchesAtOnce):
                    for queue in served.queues:
                        queue.allow(served.backend.batches_at_once, served.backend.budgets_at_once)
            except Exception as error:
                served.load_error = f"{type(error).__name__}: {error}"
                logger.exception("loading %s failed", served.card.name)
                continue
            served.load_seconds = time.monotonic() - started
            served.loaded.set()
            logger.info("loaded %s in %.1fs", served.card.name, served.load_seconds)

    @property
    def ready(self) -> bool:
        return not self.not_ready_reasons()

    def not_ready_reasons(self) -> list[str]:
        return [reason for served in self._models.values() if (reason := served.not_ready_reason())]

    def start(self) -> None:
        """Start the batch loops; call from inside the running event loop."""
        for served in self._models.values():
            for queue in served.queues:
                queue.start()

    async def stop(self, drain_s: float = 0.0) -> None:
        """Stop the batch loops, first letting requests in flight finish for up to `drain_s` seconds."""
        for served in self._models.values():
            await asyncio.gather(*(queue.stop(drain_s) for queue in served.queues))
            served.preparing.close()

    # ---- deciding -----------------------------------------------------------------------
    def begin(self, model: str, request: DecisionRequest) -> DecisionRun:
        """Check all that needs no model work (model, readiness, capabilities, `depends_on`/`ask_if`), then
        hand back the run, whose stages are read as it is iterated (the server streams them)."""
        served = self.resolve(model)
        if (reason := served.not_ready_reason()) is not None:
            raise NotReady(reason)
        return self._run(served, request)

    async def decide(self, model: str, request: DecisionRequest) -> Decision:
        """Answer one request through the model's batch queue (the server's path)."""
        run = self.begin(model, request)
        async for _ in run.stages():
            pass
        return run.decision()

    def decide_now(self, model: str, request: DecisionRequest) -> Decision:
        """Answer one request in the calling thread, without queueing (library and CLI use)."""
        served = self.resolve(model)
        if not served.loaded.is_set():
            raise NotReady("; ".join(self.not_ready_reasons()) or f"{served.card.name} is not loaded")
        run = self._run(served, request)
        for _ in run.stages_now():
            pass
        return run.decision()

    def _run(self, served: ServedModel, request: DecisionRequest) -> DecisionRun:
        check_capabilities(served.card, request)
        return DecisionRun(served, request, self.settings, self._escalation(served, request))

    def _escalation(self, served: ServedModel, request: DecisionRequest) -> Escalation[ServedModel] | None:
        """Where this request's unsure answers go (None: nowhere; a request to the target itself stays there)."""
        picked = chosen(self.settings.escalate_to, self.settings.escalate_below, request.options)
        if picked is None or (target := self.resolve(picked[0])) is served:
            return None
        return Escalation(served.card.name, target, target.card, picked[1], target.not_ready_reason())

    def ask(
        self,
        state: JSONValue,
        questions: Mapping[str, Any],
        *,
        model: str = "default",
        **extensions: JSONValue,
    ) -> dict[str, JSONValue]:
        """The library's one-call API: the same JSON as `POST /v1/systemone`, answered in this thread."""
        name, request = parse_request({"model": model, "state": state, "questions": questions, **extensions})
        return self.decide_now(name, request).to_json()
