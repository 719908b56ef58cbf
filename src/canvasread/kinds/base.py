"""What every question kind provides: the one surface the rest of canvasread asks about a kind.

A kind (noul, choice, score, box, span, spans) is one module of this package
holding one `Kind`: its wire question and answer models, how its options come
from the wire and what limits them, how a canvas labels and reads it, how its
distribution becomes an answer and a confidence, whether calibration and
rotation apply, what it means to `ask_if` and to a later stage's context, and
how a person reads its answer. Nothing outside this package switches on a
kind's name: it asks `canvasread.kinds.kind_of(name)`.

The pydantic bases here are the wire's: strict (no "0" for false, no "5" for
5), unknown keys ignored, as the hosted API does.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from canvasread.types import (
    AskIfValue,
    Capabilities,
    DecisionRequest,
    Distribution,
    JSONValue,
    Option,
    OrderMode,
    Question,
)

# The labels of a score's levels and of a box's edge digits: Gemma's tokenizer keeps each digit one token.
DIGITS = tuple(string.digits)
# What instructions, descriptions and states may be: text, a JSON object or an array (never a bare number or
# boolean), as the official SDK's generated models declare.
Content = str | dict[str, Any] | list[Any]


class WireModel(BaseModel):
    # Strict: the server accepts what its schema says and no more (no "0" for false, no "5" for 5).
    model_config = ConfigDict(extra="ignore", strict=True)


class QuestionBase(WireModel):
    """The keys every question takes, whatever its kind (a kind's model narrows `type` and adds its `criteria`)."""

    type: str
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


class AnswerBase(WireModel):
    """The keys every answer may carry besides its kind's own (a kind's model narrows `type`)."""

    type: str
    abstain: bool | None = Field(
        None, description="canvasread extension, with min_confidence: true when the confidence is below it."
    )
    diagnostics: dict[str, Any] | None = Field(
        None, description="canvasread extension, with diagnostics: true: how the answer was read."
    )


def description(value: JSONValue) -> JSONValue:
    """A blank text says nothing: `""` or whitespace is null (one popular client sends `""` for every undescribed
    side), so it never moves an answer nor counts as something asked."""
    return None if isinstance(value, str) and not value.strip() else value


def as_text(value: JSONValue) -> str:
    """Strings as they are; JSON values compact, non-ASCII kept (how prompts and stage context write them)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def confidence(probabilities: Sequence[float]) -> float:
    """How far the top option stands above a uniform guess: `(p_max − 1/k) / (1 − 1/k)` clipped to [0, 1].

    This is the formula that reproduces the hosted API's numbers; with one
    option there is nothing to doubt, so it is 1.
    """
    k = len(probabilities)
    if k <= 1:
        return 1.0
    uniform = 1.0 / k
    value = (max(probabilities) - uniform) / (1.0 - uniform)
    return min(1.0, max(0.0, value))


def top_index(probabilities: Sequence[float]) -> int:
    """The argmax; ties go to the earliest option so answers are stable."""
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))


def rounded(value: float, decimals: int | None) -> float:
    """Numbers are rounded only at the very end, as the hosted API computes before it rounds."""
    return value if decimals is None else round(value, decimals)


def option_bucket(name: str, option_count: int) -> str:
    """A calibration bucket by option count rounded up to a power of two (`choice/3-4`, `score/5-8`).

    Overconfidence grows with the number of options, so 3 and 77 options get
    different temperatures; powers of two keep buckets few enough to fit.
    """
    if option_count <= 2:
        return f"{name}/{option_count}"
    high = 1 << (option_count - 1).bit_length()
    return f"{name}/{high // 2 + 1}-{high}"


@dataclass(frozen=True)
class Blank:
    """How a kind answered with pieces of the state is read: a blank after `name:` (see `canvasread.canvas.spans`).

    `room` is the blank's width in tokens (capped by the canvas). With a `separator` the kind lists several
    pieces, one per round, the separator between them on the line; without one it stops at the first piece.
    """

    room: int
    separator: str | None = None


class Kind:
    """One question kind; a module of `canvasread.kinds` subclasses it once and registers the instance.

    The defaults suit a kind answered by choosing among options; each kind overrides what differs.
    """

    name: ClassVar[str]
    question_model: ClassVar[type[QuestionBase]]
    answer_model: ClassVar[type[AnswerBase]]
    # canvas: the prompt's header for the question (formatted with `top`, the last option's index) and guide.
    header: ClassVar[str]
    guide: ClassVar[str | None] = None
    # canvas: the text before each slot of the answer line (after `name: `), one slot per entry.
    slot_texts: ClassVar[tuple[str, ...]] = ("",)
    # canvas: the slots the `samples: "auto"` re-read rule judges the question by.
    judged_slots: ClassVar[tuple[int, ...]] = (0,)
    # canvas: whether labels that merge with their neighbours may be swapped for other pool labels.
    relabel: ClassVar[bool] = False
    # canvas: answered with pieces of the state, read at a blank (None: read at label slots).
    blank: ClassVar[Blank | None] = None
    # `order: "rotate"` reads the options in several rotations (only where option order carries no meaning).
    rotates: ClassVar[bool] = False

    # ---- the wire -----------------------------------------------------------------------
    def options(self, question: Any) -> tuple[Option, ...]:
        """The answer space of a validated wire question, in the caller's order (none: answered otherwise)."""
        return ()

    def criteria(self, question: Question) -> JSONValue:
        """The question's criteria as the wire carries them (a model that reads wire-shaped questions takes them)."""
        return None

    # ---- what a model must offer --------------------------------------------------------
    def option_limit(self, capabilities: Capabilities) -> tuple[int, str] | None:
        """The most options a model takes for this kind and what they are called (None: no limit applies)."""
        return None

    def refusal(self, model: str, capabilities: Capabilities, request: DecisionRequest) -> str | None:
        """Why the model behind `capabilities` cannot answer this kind in `request` (None: it can)."""
        return None

    def state_refusal(self, state: JSONValue) -> str | None:
        """Why this kind cannot be asked about `state` (None: any state will do)."""
        return None

    # ---- the canvas ---------------------------------------------------------------------
    def labels(self, option_names: Sequence[str], pool: Sequence[str]) -> list[str]:
        """The labels a question starts with, one per label of its slots; `pool` is the tokenizer's label pool."""
        return list(pool[: len(option_names)])

    def describe(self, option: Option) -> str:
        """What an option means, beside its label in the prompt."""
        return option.name if option.description is None else f"{option.name} — {as_text(option.description)}"

    def read_out(self, slots: Sequence[Sequence[float]]) -> Distribution:
        """The answer's distribution from each slot's label distribution (slot order as `slot_texts`)."""
        return Distribution(tuple(slots[0]))

    # ---- answers ------------------------------------------------------------------------
    def answer(self, question: Question, distribution: Distribution, decimals: int | None) -> dict[str, JSONValue]:
        """The kind's answer object (without `abstain` and `diagnostics`), keys in the hosted API's order."""
        raise NotImplementedError

    def confidence(self, question: Question, distribution: Distribution) -> float:
        """The confidence that `min_confidence` is compared against."""
        return confidence(distribution.probabilities)

    def probabilities_of(self, answer: Mapping[str, Any], option_names: Sequence[str]) -> tuple[float, ...]:
        """A wire answer's probabilities in `option_names` order (evaluation reads answers back)."""
        return tuple(float(answer["probabilities"][name]) for name in option_names)

    def summary(self, answer: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
        """A wire answer in words for a person, and the probabilities to draw, labelled for them."""
        raise NotImplementedError

    # ---- calibration --------------------------------------------------------------------
    def bucket(self, option_count: int) -> str | None:
        """The calibration bucket of a question with `option_count` options (None: never calibrated)."""
        return option_bucket(self.name, option_count)

    # ---- stages -------------------------------------------------------------------------
    def ask_if_problem(self, question: Question, value: AskIfValue) -> str | None:
        """Why `value` can never be `question`'s answer in `ask_if`'s words (None when it can)."""
        raise NotImplementedError

    def ask_if_value(self, question: Question, distribution: Distribution) -> AskIfValue:
        """The answer in `ask_if`'s words (only asked of kinds whose `ask_if_problem` admits some value)."""
        raise NotImplementedError

    def context(self, question: Question, distribution: Distribution) -> str:
        """The answer as a later stage's context line tells it, after "- `key` (instructions): "."""
        raise NotImplementedError
