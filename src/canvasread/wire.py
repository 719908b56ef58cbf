"""The System One wire format: pydantic models for requests and responses, and the step to internal types.

The HTTP layer, the CLI and `canvasread eval` all accept the same JSON, so
its validation lives here rather than inside `server/`. Validation errors
are located by the field paths the caller wrote (`("questions", "team",
"choice", "criteria")`, the question's kind after its id as the hosted API
does; see `canvasread.problems`); the HTTP layer puts `"body"` before them.
Keys no model reads are warnings (`canvasread.keys`), or refusals under
`strict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.images import decode_assets
from canvasread.keys import UnknownKey, unknown_keys
from canvasread.kinds import KINDS, kind_of
from canvasread.kinds.base import AnswerBase, Content, QuestionBase, WireModel
from canvasread.problems import problems_from
from canvasread.settings import ImageLimits
from canvasread.types import (
    MAX_STEPS,
    MAX_THINK_TOKENS,
    Capabilities,
    Condition,
    DecisionRequest,
    InputWarning,
    OrderMode,
    Question,
    RequestOptions,
)

MAX_SAMPLES = 16
# What a request's warnings say is done with what no answer honours, and what `--strict` says instead.
IGNORED = {
    "extra_forbidden": "it is ignored",
    "empty_state": "every answer is the model's guess without one",
}
STRICT = "this server refuses it (serve --strict)"

if TYPE_CHECKING:  # the union of every kind's model, as mypy can name it
    WireQuestion = QuestionBase
    WireAnswer = AnswerBase
else:  # built from the registry, so a new kind's module adds its models to the schema
    WireQuestion = Annotated[reduce(or_, (k.question_model for k in KINDS.values())), Field(discriminator="type")]
    WireAnswer = Annotated[reduce(or_, (k.answer_model for k in KINDS.values())), Field(discriminator="type")]


class WireAsset(WireModel):
    type: Literal["image"] | None = Field(None, description="Identifies an image asset (null: an image).")
    format: Literal["png", "jpg", "jpeg"] | None = None
    data_base64: str | None = None
    part: str | None = None

    @model_validator(mode="after")
    def _has_data(self) -> WireAsset:
        if self.part is None and self.data_base64 is None:
            raise ValueError("an asset needs data_base64 (with format) or, in a multipart request, part")
        return self


class Escalate(WireModel):
    """canvasread extension: re-ask of another model the questions answered with less confidence than `below`."""

    below: Annotated[float, Field(ge=0, le=1)] = Field(description="The confidence under which an answer is re-asked.")
    to: str | None = Field(None, description="The model to re-ask (default: the server's --escalate).")


class SystemOneRequest(WireModel):
    """`POST /v1/systemone`. Unknown top-level keys are ignored, as the hosted API does."""

    model: str = Field(description="A name or alias from GET /v1/models.")
    state: Content = Field(validation_alias=AliasChoices("state", "document"))
    questions: dict[str, WireQuestion] = Field(min_length=1)
    assets: dict[str, WireAsset] | None = Field(None, min_length=1)
    samples: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] | Literal["auto"] = Field(
        "auto", description="canvasread extension: reads per question (1..16) or 'auto'."
    )
    seed: int | None = Field(None, description="canvasread extension: the same seed gives the same answer.")
    diagnostics: bool = Field(False, description="canvasread extension: add per-question read details.")
    think: Annotated[int, Field(ge=1, le=MAX_THINK_TOKENS)] | None = Field(
        None,
        description="canvasread extension: before reading, the model writes up to this many tokens in its thought "
        "channel, and every read of the request conditions on that thought (DiffusionGemma models only).",
    )
    order: OrderMode | None = Field(None, description="canvasread extension: default order mode for every question.")
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = Field(
        1, description="canvasread extension: denoising steps per read (1..8), every position but the slots pinned."
    )
    escalate: Escalate | None = Field(
        None, description="canvasread extension: re-ask unsure answers of another model ({'below': P, 'to': MODEL})."
    )


class EscalationUsage(WireModel):
    """The model unsure answers were re-asked of, how many it answered, and its tokens (in the totals too)."""

    model: str
    questions: int
    input_tokens: int
    output_tokens: int


class WireUsage(WireModel):
    input_tokens: int
    output_tokens: int
    escalation: EscalationUsage | None = Field(
        None, description="canvasread extension, present with escalation on (`escalate`, `serve --escalate`)."
    )


class SkippedQuestion(WireModel):
    """Why a question with `ask_if` (or waiting on one) was not read; see `canvasread.stages.run`."""

    reason: Literal["condition_not_met", "condition_abstained", "dependency_skipped"]
    question: str = Field(description="The question whose answer (or absence) decided it.")
    message: str
    answer: bool | str | int | None = Field(None, description="That question's answer, in ask_if's words.")
    values: list[bool | str | int] | None = Field(None, description="The ask_if values it had to be among.")


class WireWarning(WireModel):
    """Something the answers do not honour as sent, in the shape of a 422 `detail` entry (`loc` without "body")."""

    loc: list[str | int] = Field(description="The field's path inside the request, as the caller wrote it.")
    msg: str
    type: str = Field(
        description="What happened: `truncated` (a text longer than the model reads), `extra_forbidden` (a key "
        "no model reads, such as a misspelled extension), `empty_state` (nothing to read)."
    )


class SystemOneResponse(WireModel):
    model: str
    answers: dict[str, WireAnswer] = Field(min_length=1)
    usage: WireUsage
    skipped: dict[str, SkippedQuestion] | None = Field(
        None,
        description="canvasread extension, present when a question has ask_if: the questions not read, and why "
        "(they are absent from answers).",
    )
    warnings: list[WireWarning] | None = Field(
        None,
        description="canvasread extension, present when there is one: what the answers do not honour as sent "
        "(a state longer than the model reads, a misspelled key, an empty state).",
    )


class ModelEntry(WireModel):
    name: str
    description: str
    release_date: str


class ModelList(WireModel):
    models: list[ModelEntry]


def parse_request(
    payload: Any, parts: Mapping[str, bytes] | None = None, images: ImageLimits = ImageLimits(), *, strict: bool = False
) -> tuple[str, DecisionRequest]:
    """Validate a decoded JSON body (and multipart parts) into the model name and a `DecisionRequest`.

    What the request holds that no answer will honour (unknown keys, an empty state) becomes its `warnings`;
    with `strict` (`serve --strict`) it is refused with the validation errors instead, every unknown key
    included (without it, an unknown top-level key is ignored as the hosted API does, unless it is a near
    miss of one the wire reads).
    """
    refused = (
        [FieldProblem(loc, f"{what}; {STRICT}", kind) for loc, what, kind in _notices(payload, True)] if strict else []
    )
    try:
        wire = SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise InvalidRequest([*problems_from(error, payload), *refused]) from None
    if refused:
        raise InvalidRequest(refused)
    _check_states(wire)
    assets = decode_assets(wire.assets or {}, parts or {}, images)
    default_order = wire.order or "as-given"
    questions = tuple(_to_question(key, q, default_order) for key, q in wire.questions.items())
    escalate = wire.escalate
    options = RequestOptions(
        samples=wire.samples,
        seed=wire.seed,
        diagnostics=wire.diagnostics,
        steps=wire.steps,
        think=wire.think,
        escalate_below=None if escalate is None else escalate.below,
        escalate_to=None if escalate is None else escalate.to,
    )
    warnings = tuple(InputWarning(loc, f"{what}: {IGNORED[kind]}", kind) for loc, what, kind in _notices(payload))
    return wire.model, DecisionRequest(wire.state, questions, assets, options, warnings)


def _notices(payload: Any, every_key: bool = False) -> list[tuple[tuple[str | int, ...], str, str]]:
    """What a request holds that no answer honours: unknown keys (at the top level only near misses of a key
    the request does not also hold, unless `every_key`) and an empty state, each as its place, what it is and
    its type."""
    found = [
        (unknown.loc, _unknown(unknown), "extra_forbidden")
        for unknown in unknown_keys(payload, SystemOneRequest)
        if every_key or len(unknown.loc) > 1 or _slipped(unknown, payload)
    ]
    if isinstance(payload, Mapping) and not payload.get("assets"):  # images may be what the questions are about
        key = "document" if "state" not in payload and "document" in payload else "state"
        if isinstance(payload.get(key), str | dict | list) and is_empty(payload[key]):
            found.append(((key,), "the state is empty (no text to read)", "empty_state"))
    return found


def _slipped(unknown: UnknownKey, payload: Mapping[str, Any]) -> bool:
    """A top-level key that is a slip for one the wire reads, and not a key of the client's own beside it."""
    return unknown.resembles is not None and unknown.resembles not in payload


def _unknown(unknown: UnknownKey) -> str:
    if unknown.resembles is not None:
        return f"unknown key {unknown.key!r} (did you mean {unknown.resembles!r}?)"
    return f"unknown key {unknown.key!r} (the keys read here: {', '.join(unknown.known)})"


def is_empty(state: Any) -> bool:
    """Nothing to read: blank text, or objects and arrays holding nothing but blank text (keys aside)."""
    if state is None or isinstance(state, str):
        return not (state or "").strip()
    if isinstance(state, Mapping):
        return all(is_empty(value) for value in state.values())
    if isinstance(state, list):
        return all(is_empty(value) for value in state)
    return False


def _check_states(wire: SystemOneRequest) -> None:
    """Refuse each question whose kind cannot be asked about this state (a span needs a text state)."""
    problems = [
        FieldProblem(("questions", key, question.type), refusal)
        for key, question in wire.questions.items()
        if (refusal := kind_of(question.type).state_refusal(wire.state)) is not None
    ]
    if problems:
        raise InvalidRequest(problems)


def _to_question(key: str, question: QuestionBase, order: OrderMode) -> Question:
    return Question(
        key,
        question.type,
        question.instructions,
        kind_of(question.type).options(question),
        question.order or order,
        question.min_confidence,
        depends_on=tuple(question.depends_on or ()),
        ask_if=tuple(Condition(name, tuple(values)) for name, values in (question.ask_if or {}).items()),
        alone=question.alone,
    )


def check_option_counts(request: DecisionRequest, max_options: int, max_levels: int, where: str = " here") -> None:
    """Options per question against a limit: the server's flags, or a model's capabilities.

    The one place that check lives, so both say it the same way (`where` names whose limit it is, `{what}` in
    it the options' name); each kind says what limits its options (choices by `max_options`, scores by
    `max_levels`).
    """
    capabilities = Capabilities(max_options=max_options, max_levels=max_levels)
    problems = []
    for question in request.questions:
        limited = kind_of(question.kind).option_limit(capabilities)
        if limited is not None and len(question.options) > limited[0]:
            limit, what = limited
            problems.append(
                FieldProblem(
                    ("questions", question.key, question.kind, "criteria"),
                    f"at most {limit} {what} per question{where.replace('{what}', what)}",
                    "too_long",
                    ctx={"max_length": limit},
                )
            )
    if problems:
        raise InvalidRequest(problems)
