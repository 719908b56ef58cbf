"""The plain values that flow through canvasread, from validated questions to answers.

Everything here is a frozen dataclass or a type alias with no behaviour beyond
small derived properties, so every layer can import it without pulling in HTTP,
numpy or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

JSONValue: TypeAlias = "str | int | float | bool | dict[str, JSONValue] | list[JSONValue] | None"
OrderMode: TypeAlias = Literal["as-given", "rotate"]
Samples: TypeAlias = "int | Literal['auto']"
ImageFormat: TypeAlias = Literal["png", "jpeg"]
# An `ask_if` value: a noul's side (true/false), a choice's option name or a score's level index.
AskIfValue: TypeAlias = "bool | str | int"


@dataclass(frozen=True)
class Option:
    """One possible answer: its wire name and the caller's description (None: the name speaks for itself)."""

    name: str
    description: JSONValue = None


@dataclass(frozen=True)
class Condition:
    """`ask_if` entry: ask only when question `key`'s answer is one of `values` (as sent; checked by `stages`)."""

    key: str
    values: tuple[AskIfValue, ...]


@dataclass(frozen=True)
class Question:
    """A validated question, independent of the wire format.

    `kind` names its kind in `canvasread.kinds` (the registry says everything that depends on it).
    `options` is the answer space in the caller's order: `("true", "false")`
    for a noul, the criteria keys for a choice, `"0".."N-1"` for a score, and
    none for a box (its answer is four edges, see `Distribution.edges`) or a
    span/spans question (its answer is pieces of the state, see `Distribution.found`).
    `depends_on` and `ask_if` name other questions of the request (see
    `canvasread.stages`); `alone` asks for a canvas of its own.
    """

    key: str
    kind: str
    instructions: JSONValue
    options: tuple[Option, ...]
    order: OrderMode = "as-given"
    min_confidence: float | None = None
    depends_on: tuple[str, ...] = ()
    ask_if: tuple[Condition, ...] = ()
    alone: bool = False

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.options)


@dataclass(frozen=True)
class ImageAsset:
    """A decoded, checked image referenced by a placeholder string in the state or questions."""

    placeholder: str
    format: ImageFormat
    data: bytes = field(repr=False)
    width: int
    height: int


# A read takes at most this many denoising steps (the published replays of canvas reads use 2 to 6).
MAX_STEPS = 8
# The longest thought (`think`) a request may ask for. A thought is written in the engine's passes, one
# denoising loop per canvas of tokens (4 canvases of 256 on the full model, about 200 passes), and lengthens
# every read's prompt by as many tokens; 1,024 tokens is room for a paragraph of reasoning while both stay
# bounded.
MAX_THINK_TOKENS = 1024


@dataclass(frozen=True)
class RequestOptions:
    """Per-request knobs from extension keys; the defaults give the plain Jev behaviour.

    `steps` is how many denoising steps each read takes (1: one read-only step; see `canvas.reader`).
    """

    samples: int | Literal["auto"] = "auto"
    seed: int | None = None
    diagnostics: bool = False
    steps: int = 1
    # Tokens the model may write in its thought channel before the reads (None: no thought).
    think: int | None = None
    # `escalate: {"below": P, "to": MODEL}` (`canvasread.escalation`): re-ask answers less confident than P.
    escalate_below: float | None = None
    escalate_to: str | None = None


@dataclass(frozen=True)
class InputWarning:
    """Something in a request that the answer does not honour as written (a canvasread extension: `warnings`).

    The shape of a 422 `detail` entry: `loc` is the field's path inside the request (never `"body"`), `msg`
    says what happened and what to do, `type` names the kind (`state_truncated`, `unknown_key`...), so a
    server that refuses what it would warn about (`serve --strict`) sends the same entries as a 422.
    """

    loc: tuple[str | int, ...]
    msg: str
    type: str

    def to_json(self) -> dict[str, JSONValue]:
        return {"loc": list(self.loc), "msg": self.msg, "type": self.type}


@dataclass(frozen=True)
class DecisionRequest:
    """Everything a backend needs to answer one API request; `warnings` are what parsing noticed."""

    state: JSONValue
    questions: tuple[Question, ...]
    assets: Mapping[str, ImageAsset] = field(default_factory=dict)
    options: RequestOptions = RequestOptions()
    warnings: tuple[InputWarning, ...] = ()


@dataclass(frozen=True)
class Piece:
    """A piece of the state's own text: `state[start:end] == text` (character offsets), and the read's belief in it."""

    text: str
    start: int
    end: int
    confidence: float


@dataclass(frozen=True)
class Found:
    """What a span or spans question found, in reading order (by `start`).

    `confidence` is the answer's: a span's is its piece's (or, with no piece,
    that of "not found"); a spans answer's is the lowest of its decisions (each
    piece and the final "no more"). `complete` is False when the cap on pieces
    ended the search before the model said there were no more.
    """

    pieces: tuple[Piece, ...]
    confidence: float
    complete: bool = True


@dataclass(frozen=True)
class Distribution:
    """A probability distribution over one question's options, in option order.

    `details` carries backend-specific diagnostics (label mass, entropy,
    reads...) that are shown only when the caller asks for diagnostics; nothing
    reads them back. `reads` is how many model reads are behind the answer, for
    backends that count them (None: not counted), and feeds `/metrics`.

    A box question has no options; its `edges` are four distributions (top,
    bottom, left, right), each over evenly spaced positions from 0 to 1: entry
    k of n is the edge at k / (n − 1) of the image's height or width.

    A span or spans question has no options either; `found` holds its pieces.
    """

    probabilities: tuple[float, ...]
    details: Mapping[str, JSONValue] = field(default_factory=dict)
    reads: int | None = None
    edges: tuple[tuple[float, ...], ...] = ()
    found: Found | None = None


@dataclass(frozen=True)
class JobCost:
    """What one prepared job makes the model hold at once: tokens read in one pass, image pixels decoded."""

    tokens: int = 0
    pixels: int = 0

    def plus(self, other: JobCost) -> JobCost:
        return JobCost(self.tokens + other.tokens, self.pixels + other.pixels)

    def minus(self, other: JobCost) -> JobCost:
        return JobCost(self.tokens - other.tokens, self.pixels - other.pixels)


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def plus(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)


@dataclass(frozen=True)
class DecisionResult:
    """A backend's answer to one request: one distribution per question, in question order, and what the
    model could not read as sent (`warnings`: a state cut to the tokens it reads...)."""

    distributions: tuple[Distribution, ...]
    usage: Usage
    warnings: tuple[InputWarning, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What a backend can take; the HTTP layer turns violations into clear 422s."""

    images: bool = False
    # span/spans questions need a model that reads the state's own tokens back (the canvas backends).
    spans: bool = False
    max_options: int = 255
    max_levels: int = 10
    # Denoising steps a read may take: 1 for a model without a denoiser (the embedded one).
    max_steps: int = 1
    # Whether the model can write a thought before its reads (`think`).
    think: bool = False


@dataclass(frozen=True)
class ModelCard:
    """How a served model is listed by `GET /v1/models`."""

    name: str
    description: str
    release_date: str
    capabilities: Capabilities = Capabilities()
