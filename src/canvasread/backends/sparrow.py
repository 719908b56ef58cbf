"""The embedded default: `sparrow-decider`, a 2 MB numpy decision model that ships inside its wheel.

It is what a fresh machine can serve with no GPU and no download. It is weak
(its authors report 122/231 on JevBench, against 189–200 for large models),
so its model card says so; serve a DiffusionGemma checkpoint for real work.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparrow_decider.static import KINDS as SPARROW_KINDS

from canvasread.backends.base import Gone, never_gone
from canvasread.backends.sparrow_static import PooledQuestion, PooledRequest, StaticReader
from canvasread.errors import FieldProblem, InvalidRequest, PayloadTooLarge
from canvasread.kinds import kind_of
from canvasread.types import (
    Capabilities,
    DecisionRequest,
    DecisionResult,
    Distribution,
    InputWarning,
    JSONValue,
    ModelCard,
    Question,
    Usage,
)

DEFAULT_SPARROW_MODEL = "sparrow-nano-general-v1.1"
SPARROW_RELEASE_DATE = "2026-06-01"


def is_sparrow_model(name: str) -> bool:
    return name.startswith("sparrow-") or name.endswith(".sparrow")


def _text(value: JSONValue) -> str:
    """The model reads plain text; JSON values are rendered the way sparrow renders them itself."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def sparrow_question(question: Question) -> dict[str, Any]:
    """The question in sparrow's own dict form: the wire's type, instructions and criteria."""
    return {
        "type": question.kind,
        "instructions": question.instructions,
        "criteria": kind_of(question.kind).criteria(question),
    }


def _check_kinds(request: DecisionRequest) -> None:
    """Sparrow reads only the kinds it was trained on; any other is refused, never read as one of them."""
    problems = [
        FieldProblem(
            ("questions", q.key), f"sparrow models answer only {', '.join(SPARROW_KINDS)} questions, not {q.kind}"
        )
        for q in request.questions
        if q.kind not in SPARROW_KINDS
    ]
    if problems:
        raise InvalidRequest(problems)


# What one request may make the model read, in pooled tokens (each text counts at most the 512 the model reads):
# the state, then per question its instructions and every option. 65,536 admits 40 questions of 255 short options
# or 800 of 10, and keeps the worker's share of the worst admitted request to seconds (a 255-option read is ~30 ms).
DEFAULT_MAX_REQUEST_TOKENS = 65_536


@dataclass(frozen=True)
class SparrowLimits:
    """What one request may make an embedded model read.

    `max_state_tokens` (`serve --max-state-tokens`) refuses a state of more tokens with a 413; without it a
    state longer than the model reads is answered from its beginning, with a warning.
    """

    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    max_state_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_request_tokens < 1 or (self.max_state_tokens is not None and self.max_state_tokens < 1):
            raise ValueError("max_request_tokens and max_state_tokens must be at least 1")


@dataclass(frozen=True)
class SparrowJob:
    """A request with every text already read (`pooled`; None for models that are not static), and the texts
    the model reads only the beginning of (`warnings`)."""

    request: DecisionRequest
    pooled: PooledRequest | None
    warnings: tuple[InputWarning, ...] = ()


class SparrowBackend:
    """Answers each question independently on the CPU.

    Text work (rendering, tokenising, pooling) happens once per request in `prepare`, on the request's own
    thread; the worker runs only numpy, so a request with a huge state does not hold it for seconds.
    """

    def __init__(self, model: str = DEFAULT_SPARROW_MODEL, limits: SparrowLimits = SparrowLimits()) -> None:
        self._model_name = model
        self.limits = limits
        self._decider: Any = None
        self._reader: StaticReader | None = None
        self._card = ModelCard(
            name=model.removesuffix(".sparrow").rsplit("/", 1)[-1],
            description=(
                f"{model}: the small CPU decision model embedded in the sparrow-decider wheel (numpy, ~2 MB). "
                "Fast and offline but weak (its authors report 122/231 on JevBench); "
                "serve a DiffusionGemma checkpoint with --model for real work."
            ),
            release_date=SPARROW_RELEASE_DATE,
            capabilities=Capabilities(images=False, max_options=255, max_levels=10),
        )

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def library(self) -> Any:
        """The loaded `sparrow_decider.Decider` (None before `load()`), for tests that look at its tokenizer."""
        return self._decider

    def load(self) -> None:
        from sparrow_decider import Decider

        self._decider = Decider.load(self._model_name)
        self._reader = StaticReader(self._decider.static) if self._decider.static is not None else None

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the .sparrow file (weights, tokenizer and config all live inside it); known before loading."""
        from sparrow_decider import _resolve  # the wheel's own name → file lookup (pinned version)

        return "sha256:" + hashlib.sha256(Path(_resolve(self._model_name)).read_bytes()).hexdigest()

    def prepare(self, request: DecisionRequest) -> SparrowJob:
        """Read every text of the request once; past `max_request_tokens`, or a state past `max_state_tokens`, it
        is refused (413) before it queues."""
        _check_kinds(request)
        if self._reader is None:
            return SparrowJob(request, None)
        reader, limit = self._reader, self.limits.max_state_tokens
        state_ids = None
        if limit is not None:
            state_ids = reader.state_tokens(request.state, max(limit, reader.max_len) + 1)
            if len(state_ids) > limit:
                raise PayloadTooLarge(
                    f"the state is longer than {limit} tokens, the most this server reads of a state "
                    "(--max-state-tokens); send a shorter state"
                )
        asked = [q for q in request.questions if len(q.options) > 1]
        pooled = reader.pool_request(
            request.state, [sparrow_question(q) for q in asked], self.limits.max_request_tokens, state_ids
        )
        return SparrowJob(request, pooled, _cut_warnings(pooled, asked, reader.max_len))

    def decide(self, jobs: Sequence[SparrowJob], gone: Gone = never_gone) -> list[DecisionResult | None]:
        """Question by question, so a request whose caller has left stops at the next question."""
        return [self._decide_one(job, functools.partial(gone, index)) for index, job in enumerate(jobs)]

    def _decide_one(self, job: SparrowJob, left: Callable[[], bool]) -> DecisionResult | None:
        if job.pooled is None:
            return self._decide_unpooled(job.request, left)
        pooled = iter(job.pooled.questions)
        distributions = []
        for question in job.request.questions:
            if left():
                return None
            if len(question.options) == 1:
                distributions.append(Distribution((1.0,)))
                continue
            read = next(pooled)
            probabilities = self._reader_probabilities(job.pooled, read)
            details: dict[str, JSONValue] = {"truncated": job.pooled.state.cut or bool(read.cut)}
            distributions.append(Distribution(_in_option_order(question, read.names, probabilities), details))
        usage = Usage(job.pooled.tokens, len(job.request.questions))
        return DecisionResult(tuple(distributions), usage, job.warnings)

    def _reader_probabilities(self, pooled: PooledRequest, question: PooledQuestion) -> Sequence[float]:
        assert self._reader is not None
        return [float(p) for p in self._reader.probabilities(pooled.state, question)]

    def _decide_unpooled(self, request: DecisionRequest, left: Callable[[], bool]) -> DecisionResult | None:
        """Models with an attention encoder read state and question together, so each question tokenises both."""
        distributions = []
        for question in request.questions:
            if left():
                return None
            if len(question.options) == 1:
                distributions.append(Distribution((1.0,)))
                continue
            _, names, _, probabilities = self._decider.probs(request.state, sparrow_question(question))
            distributions.append(Distribution(_in_option_order(question, names, [float(p) for p in probabilities])))
        texts = [_text(request.state)] + [_text(q.instructions) for q in request.questions]
        texts += [f"{o.name} {_text(o.description)}" for q in request.questions for o in q.options]
        tokens = sum(len(self._decider.tok.encode(text)) for text in texts if text)
        return DecisionResult(tuple(distributions), Usage(tokens, len(request.questions)))


def _cut_warnings(pooled: PooledRequest, asked: Sequence[Question], max_len: int) -> tuple[InputWarning, ...]:
    """A warning for each text the model read only the first `max_len` tokens of, located where it was sent."""
    warnings = []
    if pooled.state.cut:
        message = (
            f"the embedded model reads the first {max_len} tokens of the state and this state has more: the rest "
            f"was not read (send a shorter state; `serve --max-state-tokens {max_len}` refuses such states)"
        )
        warnings.append(InputWarning(("state",), message, "truncated"))
    for question, read in zip(asked, pooled.questions, strict=True):
        for text in read.cut:
            if text == "instructions":
                loc: tuple[str | int, ...] = ("questions", question.key, "instructions")
                what = "these instructions (with the answers they depend on written in)"
            else:
                listed = isinstance(kind_of(question.kind).criteria(question), list)  # levels sit at their index
                loc = ("questions", question.key, "criteria", int(text) if listed else text)
                what = "this option (its name and description)"
            message = f"the embedded model reads the first {max_len} tokens of {what}; the rest was not read"
            warnings.append(InputWarning(loc, message, "truncated"))
    return tuple(warnings)


def _in_option_order(question: Question, names: Sequence[str], probabilities: Sequence[float]) -> tuple[float, ...]:
    by_name = dict(zip(names, probabilities, strict=True))
    total = sum(by_name.values())
    return tuple(by_name[name] / total for name in question.option_names)
