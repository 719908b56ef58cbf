"""Planning a canvas read: the prompts, the canvases, the verified label slots, and seeded noise.

A canvas is the answer's fixed text — one `name: label` line per question,
end-of-turn, at least one pad — where only the label slots hold noise; its
prompt (`PlannedCanvas.prompt`, worded in `canvasread.canvas.prompt`) lists the
questions with their labels. Requests with the same questions share their
prompts' system turns, so those tokens form the cacheable prefix and their
canvases and labels are planned once. Where only the real weights could
decide (the thought block's place, one prompt per request or per canvas, a
bare label for a single question...), the server's `ReadLayout` says.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from canvasread.canvas import seeds, spans
from canvasread.canvas.labels import (
    LabelError,
    SlotSpec,
    VerifiedSlot,
    choice_label_pool,
    initial_labels,
    other_forms,
    verify_canvas,
)
from canvasread.canvas.layouts import DEFAULT_LAYOUT, ReadLayout
from canvasread.canvas.prompt import (
    BARE_INTRO,
    LINES_INTRO,
    THOUGHT_BLOCK,
    EncodedPrompt,
    ImageTokens,
    PromptEncoder,
    PromptText,
    question_block,
)
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.kinds import kind_of
from canvasread.kinds.base import as_text
from canvasread.types import DecisionRequest, Question

CANVAS_TAIL = "<turn|>"
# Canvas widths are rounded up to a multiple of 16: fewer distinct shapes for kernels and CUDA graphs.
CANVAS_ALIGN = 16
# Pads after end-of-turn: vLLM's reader found that a canvas whose lines and `<turn|>` fill it loses label mass.
MIN_PADDING = 1
# Past this many questions the canvas names questions by number (as djev's "indexed" template does).
COMPACT_AFTER = 10
SIMPLE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")


def question_digest(question: Question) -> str:
    """A hash of what a question asks (not its key), so noise can follow the question wherever it is placed."""
    content = [question.kind, question.instructions, [[o.name, o.description] for o in question.options]]
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PlannedQuestion:
    """Where a question is read: one slot, or a box's eight digit slots, in one canvas."""

    question: Question
    name: str
    slots: tuple[VerifiedSlot, ...]
    canvas: int
    digest: str

    @property
    def labels(self) -> tuple[str, ...]:
        return self.slots[0].labels

    @property
    def label_ids(self) -> tuple[int, ...]:
        return self.slots[0].label_ids

    @property
    def position(self) -> int:
        return self.slots[0].position


@dataclass(frozen=True)
class PlannedCanvas:
    """Token ids padded to the canvas width; each slot holds its first label until noise replaces it.

    `prompt` indexes the layout's prompts: the one this canvas is read against.
    """

    ids: tuple[int, ...]
    questions: tuple[int, ...]
    text_tokens: int
    prompt: int = 0


@dataclass(frozen=True)
class Layout:
    """What depends only on the questions: shared by every request that asks them."""

    prompts: tuple[PromptText, ...]
    questions: tuple[PlannedQuestion, ...]
    canvases: tuple[PlannedCanvas, ...]


@dataclass(frozen=True)
class ReadPlan:
    """A request's layout with its prompts encoded (state and images in place), one per layout prompt."""

    prompts: tuple[EncodedPrompt, ...]
    layout: Layout

    @property
    def questions(self) -> tuple[PlannedQuestion, ...]:
        return self.layout.questions

    @property
    def canvases(self) -> tuple[PlannedCanvas, ...]:
        return self.layout.canvases

    @property
    def prompt_tokens(self) -> int:
        """Tokens the encoder reads for this request: each prompt once, however many canvases share it."""
        return sum(len(prompt.ids) for prompt in self.prompts)

    def prompt(self, canvas: PlannedCanvas) -> EncodedPrompt:
        return self.prompts[canvas.prompt]


class Planner:
    """Builds `ReadPlan`s for one tokenizer and canvas length, caching layouts by question set."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        canvas_length: int,
        max_positions: int | None,
        images: ImageTokens | None = None,
        layout: ReadLayout = DEFAULT_LAYOUT,
        cache_size: int = 512,
    ) -> None:
        self.tokenizer = tokenizer
        self.read_layout = layout
        self.canvas_length = canvas_length
        self.max_positions = max_positions
        self.encoder = PromptEncoder(tokenizer, images, thought_in_prompt=layout.thought == "prompt")
        self._layouts: OrderedDict[str, Layout] = OrderedDict()
        self._cache_size = cache_size
        self._head = THOUGHT_BLOCK if layout.thought == "canvas" else ""
        self._overhead = len(tokenizer.encode(self._head + CANVAS_TAIL)) + MIN_PADDING
        self._pool = choice_label_pool(tokenizer)

    def plan(self, request: DecisionRequest) -> ReadPlan:
        layout = self.layout(request.questions)
        prompts = self.encoder.encode_all(layout.prompts, as_text(request.state), request.assets)
        for index, prompt in enumerate(prompts):
            width = max(len(canvas.ids) for canvas in layout.canvases if canvas.prompt == index)
            if self.max_positions is not None and len(prompt.ids) + width > self.max_positions:
                raise self._past_context(layout.prompts[index], len(prompt.ids), width, self.max_positions)
        return ReadPlan(prompts, layout)

    def _past_context(self, prompt: PromptText, tokens: int, width: int, max_positions: int) -> InvalidRequest:
        """A prompt too long for the model, blamed on the questions when they leave the answer no room even without
        the state (a shorter state would not help), else on the state. Only a refusal tokenizes them again."""
        asked = len(self.tokenizer.encode(self.encoder.text(prompt, "")))
        reads = f"the answer {width}; this model reads at most {max_positions}"
        if asked + width > max_positions:
            return InvalidRequest.at(("questions",), f"the questions take {asked} tokens without the state and {reads}")
        return InvalidRequest.at(
            ("state",), f"the state and questions take {tokens} tokens (the questions {asked} of them) and {reads}"
        )

    def layout(self, questions: Sequence[Question]) -> Layout:
        key = json.dumps([[q.key, question_digest(q), q.alone] for q in questions], ensure_ascii=False)
        cached = self._layouts.get(key)
        if cached is not None:
            self._layouts.move_to_end(key)
            return cached
        layout = self._build_layout(questions)
        self._layouts[key] = layout
        if len(self._layouts) > self._cache_size:
            self._layouts.popitem(last=False)
        return layout

    def _build_layout(self, questions: Sequence[Question]) -> Layout:
        compact = len(questions) > COMPACT_AFTER or not all(SIMPLE_KEY.fullmatch(q.key) for q in questions)
        names = [str(i + 1) if compact else q.key for i, q in enumerate(questions)]
        bare = self.read_layout.single == "bare" and len(questions) == 1 and not _is_blank(questions[0])
        starts = ["" if bare else f"{name}: " for name in names]
        labels: list[list[str]] = []
        for question in questions:
            if _is_blank(question):  # no labels: the blank is read at the state's own tokens
                labels.append([])
                continue
            try:
                labels.append(initial_labels(kind_of(question.kind), question.option_names, self._pool))
            except LabelError as error:
                raise _label_problem(question, error) from None
        groups = self._pack(starts, labels, questions)
        per_canvas = self.read_layout.prompts == "canvas"
        planned: dict[int, PlannedQuestion] = {}
        canvases = []
        for canvas_index, group in enumerate(groups):
            blank = kind_of(questions[group[0]].kind).blank
            if blank is not None:
                ids, verified = self._blank(questions[group[0]], names[group[0]])
            else:
                ids, verified = self._verify(questions, starts, labels, group)
            room = MIN_PADDING if blank is None else blank.room
            width = min(self.canvas_length, math.ceil((len(ids) + room) / CANVAS_ALIGN) * CANVAS_ALIGN)
            if len(ids) + MIN_PADDING > self.canvas_length:
                raise InvalidRequest.at(("questions",), "a question's answer line does not fit in a canvas")
            padded = tuple(ids) + (self.tokenizer.pad_id,) * (width - len(ids))
            canvases.append(PlannedCanvas(padded, tuple(group), len(ids), canvas_index if per_canvas else 0))
            for q_index, slots in zip(group, verified, strict=True):
                question = questions[q_index]
                planned[q_index] = PlannedQuestion(
                    question, names[q_index], slots, canvas_index, question_digest(question)
                )
        ordered = tuple(planned[i] for i in range(len(questions)))
        return Layout(_prompt_texts(ordered, groups, compact, bare, per_canvas), ordered, tuple(canvases))

    def _pack(
        self, starts: Sequence[str], labels: Sequence[Sequence[str]], questions: Sequence[Question]
    ) -> list[list[int]]:
        """Greedy: consecutive questions share a canvas while their lines, `<turn|>` and a pad fit (a token of slack
        per line).

        A question marked `alone` gets a canvas (so a read) of its own: neighbours on one canvas
        influence each other's slots. Its prompt still lists every question of the request, unless the
        layout gives each canvas a prompt of its own. A span question is always alone: its blank runs to the end
        of its canvas.
        """
        lines = [
            f"{start}{''.join(text + ls[0] for text in _slot_texts(question))}\n" if ls else f"{start}\n"
            for start, ls, question in zip(starts, labels, questions, strict=True)
        ]
        sizes = [len(ids) + 1 for ids in self.tokenizer.encode_batch(lines)]
        budget = self.canvas_length - self._overhead
        groups: list[list[int]] = [[]]
        used = 0
        for index, size in enumerate(sizes):
            shared = not _alone(questions[index]) and not (index and _alone(questions[index - 1]))
            if groups[-1] and (used + size > budget or not shared):
                groups.append([])
                used = 0
            groups[-1].append(index)
            used += size
        return groups

    def _blank(self, question: Question, name: str) -> tuple[list[int], list[tuple[VerifiedSlot, ...]]]:
        """A span question's canvas: `name:`, then the blank (one slot, without labels, marks where it starts)."""
        ids = self.tokenizer.encode(f"{self._head}{name}:")
        if len(ids) + spans.MIN_BLANK > self.canvas_length:
            raise InvalidRequest.at(("questions", question.key), "the question's name leaves no room to answer")
        return ids, [(VerifiedSlot(len(ids), (), ()),)]

    def _verify(
        self, questions: Sequence[Question], starts: Sequence[str], labels: list[list[str]], group: Sequence[int]
    ) -> tuple[list[int], list[tuple[VerifiedSlot, ...]]]:
        """Verify one canvas's labels in context; returns its ids and, per question of `group`, its slots."""
        text, slots, owners = self._head, [], []
        for position, q_index in enumerate(group):
            question = questions[q_index]
            text += starts[q_index]
            for before in _slot_texts(question):
                text += before
                slots.append(SlotSpec(len(text), tuple(labels[q_index]), kind_of(question.kind).relabel))
                owners.append(q_index)
            text += "\n" if position < len(group) - 1 else ""
        text += CANVAS_TAIL
        try:
            ids, verified = verify_canvas(self.tokenizer, text, slots, self._pool)
        except LabelError as error:
            culprit = questions[owners[error.slot]] if error.slot is not None else None
            raise _label_problem(culprit, error) from None
        if self.read_layout.label_forms == "both":
            verified = [other_forms(self.tokenizer, slot) for slot in verified]
        per_question = [tuple(v for v, owner in zip(verified, owners, strict=True) if owner == q) for q in group]
        for q_index, question_slots in zip(group, per_question, strict=True):
            labels[q_index] = list(question_slots[0].labels)
        return ids, per_question


def _prompt_texts(
    questions: Sequence[PlannedQuestion], groups: Sequence[Sequence[int]], compact: bool, bare: bool, per_canvas: bool
) -> tuple[PromptText, ...]:
    """The layout's prompts: one bare question, one per canvas, or one listing every question."""
    if bare:
        [only] = questions
        block = question_block(only.question, only.name, only.labels, compact=compact)
        return (PromptText(BARE_INTRO, "\n\n" + block),)
    listed = [[questions[q] for q in group] for group in groups] if per_canvas else [questions]
    return tuple(PromptText(_lines_system(chosen, compact)) for chosen in listed)


def _lines_system(questions: Sequence[PlannedQuestion], compact: bool) -> str:
    """The system turn of a read that answers in lines: the intro, then every question it lists."""
    blocks = [LINES_INTRO]
    blocks += [question_block(planned.question, planned.name, planned.labels, compact=compact) for planned in questions]
    return "\n\n".join(blocks)


def _alone(question: Question) -> bool:
    return question.alone or _is_blank(question)


def _is_blank(question: Question) -> bool:
    """A question answered with pieces of the state: read at a blank, not at label slots."""
    return kind_of(question.kind).blank is not None


def _slot_texts(question: Question) -> tuple[str, ...]:
    """The text before each of the question's slots on its answer line: one empty gap, or a box's eight."""
    return kind_of(question.kind).slot_texts


def _label_problem(question: Question | None, error: LabelError) -> InvalidRequest:
    if question is None:
        return InvalidRequest.at(("questions",), f"the questions cannot be labelled in one canvas: {error}")
    loc = ("questions", question.key, question.kind, "criteria")
    return InvalidRequest([FieldProblem(loc, f"question {question.key!r} cannot be labelled: {error}")])


def noisy_canvas(
    canvas: PlannedCanvas, questions: Sequence[PlannedQuestion], *, vocab_size: int, seed: int, read: int
) -> tuple[int, ...]:
    """The canvas with uniform random token ids at its slots.

    Each slot's noise is drawn from a generator seeded by (request seed, read
    number, question digest), so it follows the question's content, not its
    place (`canvasread.canvas.seeds`).
    """
    ids = list(canvas.ids)
    for q_index in canvas.questions:
        planned = questions[q_index]
        for index, slot in enumerate(planned.slots):
            ids[slot.position] = seeds.noise(seed, read, planned.digest, *([index] if index else [])).randrange(
                vocab_size
            )
    return tuple(ids)
