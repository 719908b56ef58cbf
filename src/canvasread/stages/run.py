"""Walking a request's stages: what each stage asks, given the answers of the stages before it.

Earlier answers reach a dependent question through its instructions, the one
field every backend shows its model: the sparrow model reads them as text,
the canvas backend lists them in the system turn beside the question. The
text is the question's own instructions, a blank line, then

    Answers already given about this state:
    - `is_bug` (Is this a bug report?): yes, probability 0.93
    - `team` (Which team?): billing, probability 0.81
    - `anger` (How angry?): level 2 of 0-2 (furious), probability 0.80, expected score 1.73
    - `logo` (Logo?): box at top 0.10, bottom 0.35, left 0.60, right 0.90 (fractions of the image), confidence 0.72
    - `city` (Which city?): "Paris" (characters 24-29 of the state), confidence 0.91

one line per distinct `depends_on` entry, in the order given, with the
calibrated probabilities the caller sees (two decimals). Because this is
content, the canvas backend's noise for the question follows it like any
other wording.

Each dependent gets its own copy of every line it depends on, so a small body
can ask for a large text: a 2 MiB question named by 1,000 dependents is 2 GB
of instructions. The text the lines add is counted before it is written, and
past `max_context_bytes` (`serve` makes it `--max-body-bytes`: what a caller
could have sent by writing the lines in) the request is refused with a 413:
when the request is built, from the part of each line known before any answer
(its key and instructions), and again before each stage is written, exactly.

A question is skipped, and never read, when a question it waits on was
skipped, or when an `ask_if` does not hold: the named question's answer (a
noul's side, a choice's option, a score's most probable level) is not among
the values, or that answer abstained (below its `min_confidence`). Every
`ask_if` entry must hold. A box's answer is four edges and a span's is
pieces of text, which no `ask_if` value names, so `ask_if` cannot name a box
or a span (422).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from canvasread.answers import answer_confidence
from canvasread.errors import PayloadTooLarge
from canvasread.kinds import kind_of
from canvasread.kinds.base import as_text
from canvasread.stages.graph import is_staged, prerequisites, stage_numbers
from canvasread.types import AskIfValue, DecisionRequest, Distribution, JSONValue, Question

CONTEXT_HEADER = "Answers already given about this state:"
# The text depends_on may add to one request, in UTF-8 bytes: the default body limit (`--max-body-bytes`).
DEFAULT_MAX_CONTEXT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Given:
    """A question answered in an earlier stage, as the later stages see it."""

    question: Question
    distribution: Distribution

    @property
    def value(self) -> AskIfValue:
        """The answer in `ask_if`'s words: a noul's side, a choice's option name, a score's level index."""
        return kind_of(self.question.kind).ask_if_value(self.question, self.distribution)

    @property
    def abstained(self) -> bool:
        threshold = self.question.min_confidence
        return threshold is not None and answer_confidence(self.question, self.distribution) < threshold

    def line(self) -> str:
        """The answer in a dependent's context (written once, however many questions depend on it)."""
        return self._line

    @functools.cached_property
    def _line(self) -> str:
        question = self.question
        return f"{_line_head(question)}{kind_of(question.kind).context(question, self.distribution)}"

    @functools.cached_property
    def size(self) -> int:
        """The line's UTF-8 bytes and its newline."""
        return len(self._line.encode()) + 1


def _line_head(question: Question) -> str:
    """What a context line says before the answer: the key and the question's own instructions."""
    about = "" if question.instructions is None else f" ({as_text(question.instructions)})"
    return f"- `{question.key}`{about}: "


def _written(question: Question) -> tuple[str, ...]:
    """The questions whose answers are written into `question`, each once, in the order given."""
    return tuple(dict.fromkeys(question.depends_on))


def _refuse_past(size: int, limit: int) -> None:
    if size > limit:
        raise PayloadTooLarge(
            f"depends_on would write {size:,} bytes of earlier answers into this request's instructions (each "
            f"dependent gets its own copy of every answer it names), past the {limit:,} a body may hold "
            "(--max-body-bytes); name fewer or shorter questions in depends_on"
        )


@dataclass(frozen=True)
class Stage:
    """One stage: its number, the request it reads (possibly no question), and the questions it skipped."""

    number: int
    request: DecisionRequest
    skipped: dict[str, dict[str, JSONValue]]


@dataclass
class StageRun:
    """The stages of one request, in order; `record` each stage's answers before asking for the next stage.

    Building it checks the references (`InvalidRequest` at the offending key) and that the answers to be written
    in can fit `max_context_bytes` (`PayloadTooLarge`; see the module docstring).
    """

    request: DecisionRequest
    max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES
    numbers: tuple[int, ...] = field(init=False)
    skipped: dict[str, dict[str, JSONValue]] = field(init=False, default_factory=dict)
    _given: dict[str, Given] = field(init=False, default_factory=dict)
    _next: int = field(init=False, default=0)
    _asked: dict[str, Question] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.numbers = stage_numbers(self.request.questions)
        self._asked = {question.key: question for question in self.request.questions}
        heads = {key: len(_line_head(self._asked[key]).encode()) for q in self.request.questions for key in _written(q)}
        _refuse_past(sum(map(heads.__getitem__, self._copies(self.request.questions))), self.max_context_bytes)

    @staticmethod
    def _copies(questions: Sequence[Question]) -> list[str]:
        """The key of every line the questions' contexts hold, once per dependent that holds it."""
        return [key for question in questions for key in _written(question)]

    @property
    def staged(self) -> bool:
        """Whether the request uses `depends_on` or `ask_if` (its answers then say their stage)."""
        return is_staged(self.request.questions)

    @property
    def conditional(self) -> bool:
        """Whether any question has an `ask_if` (the response then lists what was skipped)."""
        return any(question.ask_if for question in self.request.questions)

    def next_stage(self) -> Stage | None:
        """The next stage's questions, with earlier answers written in; None after the last stage."""
        if self._next > max(self.numbers):
            return None
        number, asked, skipped = self._next, [], {}
        for question, stage in zip(self.request.questions, self.numbers, strict=True):
            if stage != number:
                continue
            reason = self._skip_reason(question)
            if reason is None:
                asked.append(question)
            else:
                skipped[question.key] = reason
        _refuse_past(sum(self._given[key].size for key in self._copies(asked)), self.max_context_bytes)
        self._next += 1
        self.skipped.update(skipped)
        return Stage(number, replace(self.request, questions=tuple(map(self._with_context, asked))), skipped)

    def record(self, key: str, distribution: Distribution) -> None:
        """File an answer (calibrated, as the caller sees it) for the stages that wait on it.

        Later stages are told the question as the caller wrote it, not with its own earlier answers.
        """
        self._given[key] = Given(self._asked[key], distribution)

    def _skip_reason(self, question: Question) -> dict[str, JSONValue] | None:
        for name in prerequisites(question):
            if name in self.skipped:
                return {"reason": "dependency_skipped", "question": name, "message": f"`{name}` was skipped"}
        for condition in question.ask_if:
            given, values = self._given[condition.key], list[JSONValue](condition.values)
            if given.abstained:
                message = f"`{condition.key}` abstained (below its min_confidence)"
                return {
                    "reason": "condition_abstained",
                    "question": condition.key,
                    "values": values,
                    "message": message,
                }
            if given.value not in condition.values:
                message = f"asked only if `{condition.key}` is one of {as_text(values)}; it is {as_text(given.value)}"
                return {
                    "reason": "condition_not_met",
                    "question": condition.key,
                    "answer": given.value,
                    "values": values,
                    "message": message,
                }
        return None

    def _with_context(self, question: Question) -> Question:
        if not question.depends_on:
            return question
        lines = [CONTEXT_HEADER, *(self._given[name].line() for name in _written(question))]
        context = "\n".join(lines)
        own = question.instructions
        return replace(question, instructions=context if own is None else f"{as_text(own)}\n\n{context}")
