"""The System One wire format: pydantic models for requests and responses, and the step to internal types.

The HTTP layer, the CLI and `canvasread eval` all accept the same JSON, so
its validation lives here rather than inside `server/`. Validation errors
keep pydantic's locations, field paths inside the body (`("questions", "team",
"choice", "criteria")`); the HTTP layer puts `"body"` before them, so a 422
points at the exact bad field as the hosted API does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.images import decode_assets
from canvasread.settings import MAX_LEVELS, MAX_OPTIONS, ImageLimits
from canvasread.types import (
    MAX_STEPS,
    MAX_THINK_TOKENS,
    SPAN_KINDS,
    Condition,
    DecisionRequest,
    JSONValue,
    Option,
    OrderMode,
    Question,
    RequestOptions,
)

MAX_SAMPLES = 16

# What instructions, descriptions and states may be: text, a JSON object or an array (never a bare number or
# boolean), as the official SDK's generated models declare.
Content = str | dict[str, Any] | list[Any]


class _WireModel(BaseModel):
    # Strict: the server accepts what its schema says and no more (no "0" for false, no "5" for 5).
    model_config = ConfigDict(extra="ignore", strict=True)


class NoulCriteria(_WireModel):
    true: Content | None = Field(default=None, description="What counts as a yes answer; empty or null: undescribed.")
    false: Content | None = Field(default=None, description="What counts as a no answer; empty or null: undescribed.")


class _QuestionBase(_WireModel):
    instructions: Content | None = None
    order: OrderMode | None = Field(None, description="canvasread extension: 'rotate' averages over option rotations.")
    min_confidence: float | None = Field(
        None, ge=0.0, le=1.0, description="canvasread extension: below this confidence the answer abstains."
    )
    depends_on: list[str] | None = Field(
        None,
        description="canvasread extension: ids of questions answered first; their answers are written into "
        "this question's instructions.",
    )
    ask_if: dict[str, Annotated[list[bool | str | int], Field(min_length=1)]] | None = Field(
        None,
        description="canvasread extension: ask only if each named question's answer is among the values "
        "(true/false for a noul, option names for a choice, level indices for a score).",
    )
    alone: bool = Field(False, description="canvasread extension: read this question on a canvas of its own.")


class NoulQuestion(_QuestionBase):
    type: Literal["noul"]
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _needs_something_to_ask(self) -> NoulQuestion:
        sides = (self.criteria.true, self.criteria.false) if self.criteria is not None else ()
        described = any(description(side) is not None for side in sides)
        if self.instructions is None and not described:
            raise ValueError("a noul question needs instructions or at least one described side of criteria")
        return self


class ChoiceQuestion(_QuestionBase):
    type: Literal["choice"]
    criteria: dict[str, Any] = Field(min_length=1, max_length=MAX_OPTIONS)


class ScoreQuestion(_QuestionBase):
    type: Literal["score"]
    criteria: list[Content] = Field(min_length=1, max_length=MAX_LEVELS)


class BoxQuestion(_QuestionBase):
    """Locate what the instructions describe in the request's one image (image models only)."""

    type: Literal["box"]


class _SpanQuestionBase(_QuestionBase):
    instructions: Content = Field(description="What to find in the state.")
    criteria: Any = Field(None, description="Not allowed: the answers are pieces of the state, not options.")

    @field_validator("criteria")
    @classmethod
    def _no_criteria(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("span questions take no criteria: their answers are pieces of the state's own text")
        return value


class SpanQuestion(_SpanQuestionBase):
    """canvasread extension: the piece of the (text) state the instructions ask for, by character offsets."""

    type: Literal["span"]


class SpansQuestion(_SpanQuestionBase):
    """canvasread extension: every piece of the (text) state the instructions ask for."""

    type: Literal["spans"]


AnyWireQuestion = NoulQuestion | ChoiceQuestion | ScoreQuestion | BoxQuestion | SpanQuestion | SpansQuestion
WireQuestion = Annotated[AnyWireQuestion, Field(discriminator="type")]


class WireAsset(_WireModel):
    type: Literal["image"] | None = Field(None, description="Identifies an image asset (null: an image).")
    format: Literal["png", "jpg", "jpeg"] | None = None
    data_base64: str | None = None
    part: str | None = None

    @model_validator(mode="after")
    def _has_data(self) -> WireAsset:
        if self.part is None and self.data_base64 is None:
            raise ValueError("an asset needs data_base64 (with format) or, in a multipart request, part")
        return self


class SystemOneRequest(_WireModel):
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


class _AnswerExtras(_WireModel):
    abstain: bool | None = Field(
        None, description="canvasread extension, with min_confidence: true when the confidence is below it."
    )
    diagnostics: dict[str, Any] | None = Field(
        None, description="canvasread extension, with diagnostics: true: how the answer was read."
    )


class NoulAnswer(_AnswerExtras):
    type: Literal["noul"]
    noul: float


class ChoiceAnswer(_AnswerExtras):
    type: Literal["choice"]
    choice: str
    confidence: float
    probabilities: dict[str, float]


class ScoreAnswer(_AnswerExtras):
    type: Literal["score"]
    score: float
    confidence: float
    legend: dict[str, Any]
    probabilities: dict[str, float]


class BoxCoordinates(_WireModel):
    """Edges as fractions of the image: `top` ≤ `bottom` of its height, `left` ≤ `right` of its width."""

    top: float = Field(ge=0.0, le=1.0)
    bottom: float = Field(ge=0.0, le=1.0)
    left: float = Field(ge=0.0, le=1.0)
    right: float = Field(ge=0.0, le=1.0)


class BoxAnswer(_AnswerExtras):
    type: Literal["box"]
    box: BoxCoordinates
    confidence: float | None = Field(description="From 0 to 1; null when the model gives none.")


class SpanAnswer(_AnswerExtras):
    """canvasread extension: `text` is `state[start:end]` (character offsets); not found: "", 0, 0."""

    type: Literal["span"]
    found: bool
    text: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    confidence: float


class SpanPiece(_WireModel):
    text: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    confidence: float


class SpansAnswer(_AnswerExtras):
    """canvasread extension: every piece found, by `start`; `complete` is false when the cap on pieces was hit."""

    type: Literal["spans"]
    spans: list[SpanPiece]
    confidence: float
    complete: bool


class WireUsage(_WireModel):
    input_tokens: int
    output_tokens: int


class SkippedQuestion(_WireModel):
    """Why a question with `ask_if` (or waiting on one) was not read; see `canvasread.stages.run`."""

    reason: Literal["condition_not_met", "condition_abstained", "dependency_skipped"]
    question: str = Field(description="The question whose answer (or absence) decided it.")
    message: str
    answer: bool | str | int | None = Field(None, description="That question's answer, in ask_if's words.")
    values: list[bool | str | int] | None = Field(None, description="The ask_if values it had to be among.")


AnyAnswer = NoulAnswer | ChoiceAnswer | ScoreAnswer | BoxAnswer | SpanAnswer | SpansAnswer


class SystemOneResponse(_WireModel):
    model: str
    answers: dict[str, Annotated[AnyAnswer, Field(discriminator="type")]] = Field(min_length=1)
    usage: WireUsage
    skipped: dict[str, SkippedQuestion] | None = Field(
        None,
        description="canvasread extension, present when a question has ask_if: the questions not read, and why "
        "(they are absent from answers).",
    )


class ModelEntry(_WireModel):
    name: str
    description: str
    release_date: str


class ModelList(_WireModel):
    models: list[ModelEntry]


def problems_from(error: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[FieldProblem]:
    """Pydantic errors as 422 entries; `ctx` values are made JSON-safe (they may hold exceptions)."""
    problems = []
    for entry in error.errors(include_url=False):
        ctx: dict[str, JSONValue] = {
            key: value if isinstance(value, str | int | float | bool) else str(value)
            for key, value in entry.get("ctx", {}).items()
        }
        problems.append(
            FieldProblem(prefix + tuple(entry["loc"]), entry["msg"], entry["type"], _json_safe(entry.get("input")), ctx)
        )
    return problems


def _json_safe(value: Any) -> JSONValue:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def parse_request(
    payload: Any, parts: Mapping[str, bytes] | None = None, images: ImageLimits = ImageLimits()
) -> tuple[str, DecisionRequest]:
    """Validate a decoded JSON body (and multipart parts) into the model name and a `DecisionRequest`."""
    try:
        wire = SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise InvalidRequest(problems_from(error)) from None
    _check_span_state(wire)
    assets = decode_assets(wire.assets or {}, parts or {}, images)
    default_order = wire.order or "as-given"
    questions = tuple(_to_question(key, question, default_order) for key, question in wire.questions.items())
    options = RequestOptions(
        samples=wire.samples, seed=wire.seed, diagnostics=wire.diagnostics, steps=wire.steps, think=wire.think
    )
    return wire.model, DecisionRequest(wire.state, questions, assets, options)


def _check_span_state(wire: SystemOneRequest) -> None:
    """Span answers are character offsets into the state, so a span question needs the state to be text."""
    if isinstance(wire.state, str):
        return
    kind = "an object" if isinstance(wire.state, dict) else "an array"
    problems = [
        FieldProblem(
            ("questions", key, question.type),
            f"a {question.type} question answers with character offsets into a text state; this state is {kind} "
            "(send the text to search as the state)",
        )
        for key, question in wire.questions.items()
        if question.type in SPAN_KINDS
    ]
    if problems:
        raise InvalidRequest(problems)


def description(value: JSONValue) -> JSONValue:
    """An empty description says nothing: `""` is null (one popular client sends it for every undescribed side)."""
    return None if value == "" else value


def _to_question(key: str, question: AnyWireQuestion, order: OrderMode) -> Question:
    options: tuple[Option, ...]
    if isinstance(question, NoulQuestion):
        criteria = question.criteria or NoulCriteria()
        options = (Option("true", description(criteria.true)), Option("false", description(criteria.false)))
    elif isinstance(question, ChoiceQuestion):
        options = tuple(Option(name, description(text)) for name, text in question.criteria.items())
    elif isinstance(question, ScoreQuestion):  # levels are echoed in the legend as sent, so "" stays ""
        options = tuple(Option(str(level), text) for level, text in enumerate(question.criteria))
    else:
        options = ()
    return Question(
        key,
        question.type,
        question.instructions,
        options,
        question.order or order,
        question.min_confidence,
        depends_on=tuple(question.depends_on or ()),
        ask_if=tuple(Condition(name, tuple(values)) for name, values in (question.ask_if or {}).items()),
        alone=question.alone,
    )


def check_option_counts(request: DecisionRequest, max_options: int, max_levels: int, where: str = " here") -> None:
    """Options per choice and levels per score against a limit: the server's flags, or a model's capabilities.

    The one place that check lives, so both say it the same way (`where` names whose limit it is).
    """
    problems = []
    for question in request.questions:
        if question.kind == "noul":
            continue
        limit, what = (max_options, "options") if question.kind == "choice" else (max_levels, "levels")
        if len(question.options) > limit:
            problems.append(
                FieldProblem(
                    ("questions", question.key, question.kind, "criteria"),
                    f"at most {limit} {what} per question{where}",
                    "too_long",
                    ctx={"max_length": limit},
                )
            )
    if problems:
        raise InvalidRequest(problems)
