"""Planning a canvas read: the prompt, the canvases, the verified label slots, and seeded noise.

The prompt is the model's chat template with thinking off: a system turn that
lists every question with its labels (option names and descriptions beside
them), the state as the user turn, and (by default) the empty thought block
after the generation prompt. A canvas is the answer's fixed text — one
`name: label` line per question, end-of-turn, at least one pad — where only
the label slots hold noise. Requests with the same questions share the system
turn, so its tokens form the cacheable prefix and their canvases and labels
are planned once. Where the real weights would have to decide (the thought
block's place...), the server's `ReadLayout` says.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from canvasread.canvas import box
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
from canvasread.canvas.reader import PromptImage
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.errors import FieldProblem, InvalidRequest
from canvasread.types import DecisionRequest, ImageAsset, JSONValue, Question

THOUGHT_BLOCK = "<|channel>thought\n<channel|>"
CANVAS_TAIL = "<turn|>"
# Canvas widths are rounded up to a multiple of 16: fewer distinct shapes for kernels and CUDA graphs.
CANVAS_ALIGN = 16
# Pads after end-of-turn: vLLM's reader found that a canvas whose lines and `<turn|>` fill it loses label mass.
MIN_PADDING = 1
# Past this many questions the canvas names questions by number (as djev's "indexed" template does).
COMPACT_AFTER = 10
SIMPLE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")
STATE_MARKER = "\x00state\x00"

SYSTEM_INTRO = (
    "You are a decision model. The user's message is the state. Answer every question below about the state "
    "by choosing exactly one of the labels listed for that question.\n"
    "Write one line per question, in the order given: the question's name, a colon, a space, then the label, "
    "and nothing else."
)
KIND_HEADERS = {
    "noul": "yes or no",
    "choice": "choose one",
    "score": "score from 0 (lowest) to {top}",
    "box": "locate",
}


def as_text(value: JSONValue) -> str:
    """Strings as they are; JSON values compact, non-ASCII kept."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


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
    """Token ids padded to the canvas width; each slot holds its first label until noise replaces it."""

    ids: tuple[int, ...]
    questions: tuple[int, ...]
    text_tokens: int


@dataclass(frozen=True)
class Layout:
    """What depends only on the questions: shared by every request that asks them."""

    system: str
    questions: tuple[PlannedQuestion, ...]
    canvases: tuple[PlannedCanvas, ...]


@dataclass(frozen=True)
class ImageTokens:
    """How the model writes an image into its prompt: begin marker, `count` soft tokens, end marker."""

    begin_id: int
    token_id: int
    end_id: int
    count: Callable[[ImageAsset], int]


@dataclass(frozen=True)
class ReadPlan:
    prompt_ids: tuple[int, ...]
    prefix_length: int
    layout: Layout
    images: tuple[PromptImage, ...] = ()

    @property
    def questions(self) -> tuple[PlannedQuestion, ...]:
        return self.layout.questions

    @property
    def canvases(self) -> tuple[PlannedCanvas, ...]:
        return self.layout.canvases


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
        self.images = images
        self.read_layout = layout
        self.canvas_length = canvas_length
        self.max_positions = max_positions
        self._layouts: OrderedDict[str, Layout] = OrderedDict()
        self._cache_size = cache_size
        self._head = THOUGHT_BLOCK if layout.thought == "canvas" else ""
        self._overhead = len(tokenizer.encode(self._head + CANVAS_TAIL)) + MIN_PADDING
        self._pool = choice_label_pool(tokenizer)

    def plan(self, request: DecisionRequest) -> ReadPlan:
        layout = self.layout(request.questions)
        prompt_text = self._place_thought(self.tokenizer.chat_prompt(layout.system, as_text(request.state)))
        prompt_ids, images = self._encode_prompt(prompt_text, request.assets)
        prefix_text = self.tokenizer.chat_prompt(layout.system, STATE_MARKER)
        prefix_ids = self.tokenizer.encode(prefix_text.split(STATE_MARKER)[0])
        prefix_length = next(
            (i for i, (a, b) in enumerate(zip(prefix_ids, prompt_ids, strict=False)) if a != b),
            min(len(prefix_ids), len(prompt_ids)),
        )
        if images:  # the shared, cacheable prefix never holds an image (all soft tokens share one id)
            prefix_length = min(prefix_length, images[0].start - 1)
        width = max(len(canvas.ids) for canvas in layout.canvases)
        if self.max_positions is not None and len(prompt_ids) + width > self.max_positions:
            raise InvalidRequest.at(
                ("body", "state"),
                f"the state and questions take {len(prompt_ids)} tokens and "
                f"the answer {width}; this model reads at most {self.max_positions}",
            )
        return ReadPlan(tuple(prompt_ids), prefix_length, layout, images)

    def _encode_prompt(self, text: str, assets: Mapping[str, ImageAsset]) -> tuple[list[int], tuple[PromptImage, ...]]:
        """Token ids of the prompt, each image placeholder replaced by the model's image block."""
        if not assets:
            return self.tokenizer.encode(text), ()
        if self.images is None:
            raise InvalidRequest.at(("body", "assets"), "this model cannot see images")
        pattern = re.compile("|".join(re.escape(name) for name in sorted(assets, key=len, reverse=True)))
        unused = sorted(set(assets) - set(pattern.findall(text)))
        if unused:
            raise InvalidRequest.at(
                ("body", "assets", unused[0]),
                "the asset is not referenced in the state, instructions or criteria, so the model would never see it",
            )
        ids: list[int] = []
        images: list[PromptImage] = []
        cursor = 0
        for match in pattern.finditer(text):
            ids += self.tokenizer.encode(text[cursor : match.start()])
            asset = assets[match.group()]
            count = self.images.count(asset)
            ids.append(self.images.begin_id)
            images.append(PromptImage(len(ids), count, asset.data, hashlib.sha256(asset.data).hexdigest()[:32]))
            ids += [self.images.token_id] * count + [self.images.end_id]
            cursor = match.end()
        ids += self.tokenizer.encode(text[cursor:])
        return ids, tuple(images)

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

    def _place_thought(self, prompt: str) -> str:
        """The prompt ends with the empty thought block unless the canvas carries it (whatever the template adds)."""
        bare = prompt.removesuffix(THOUGHT_BLOCK)
        return bare + THOUGHT_BLOCK if self.read_layout.thought == "prompt" else bare

    def _build_layout(self, questions: Sequence[Question]) -> Layout:
        compact = len(questions) > COMPACT_AFTER or not all(SIMPLE_KEY.fullmatch(q.key) for q in questions)
        names = [str(i + 1) if compact else q.key for i, q in enumerate(questions)]
        labels: list[list[str]] = []
        for question in questions:
            try:
                labels.append(initial_labels(question.kind, question.option_names, self._pool))
            except LabelError as error:
                raise _label_problem(question, error) from None
        groups = self._pack(names, labels, questions)
        planned: dict[int, PlannedQuestion] = {}
        canvases = []
        for canvas_index, group in enumerate(groups):
            ids, verified = self._verify(questions, names, labels, group)
            width = min(self.canvas_length, math.ceil((len(ids) + MIN_PADDING) / CANVAS_ALIGN) * CANVAS_ALIGN)
            if len(ids) + MIN_PADDING > self.canvas_length:
                raise InvalidRequest.at(("body", "questions"), "a question's answer line does not fit in a canvas")
            canvases.append(
                PlannedCanvas(tuple(ids) + (self.tokenizer.pad_id,) * (width - len(ids)), tuple(group), len(ids))
            )
            for q_index, slots in zip(group, verified, strict=True):
                question = questions[q_index]
                planned[q_index] = PlannedQuestion(
                    question, names[q_index], slots, canvas_index, question_digest(question)
                )
        ordered = tuple(planned[i] for i in range(len(questions)))
        return Layout(self._system_text(ordered, compact), ordered, tuple(canvases))

    def _pack(
        self, names: Sequence[str], labels: Sequence[Sequence[str]], questions: Sequence[Question]
    ) -> list[list[int]]:
        """Greedy: consecutive questions share a canvas while their lines, `<turn|>` and a pad fit (a token of slack
        per line).

        A question marked `alone` gets a canvas (so a read) of its own: neighbours on one canvas
        influence each other's slots. The prompt still lists every question of the request.
        """
        lines = [
            f"{name}: {''.join(text + ls[0] for text in _slot_texts(question))}\n"
            for name, ls, question in zip(names, labels, questions, strict=True)
        ]
        sizes = [len(ids) + 1 for ids in self.tokenizer.encode_batch(lines)]
        budget = self.canvas_length - self._overhead
        groups: list[list[int]] = [[]]
        used = 0
        for index, size in enumerate(sizes):
            shared = not questions[index].alone and not (index and questions[index - 1].alone)
            if groups[-1] and (used + size > budget or not shared):
                groups.append([])
                used = 0
            groups[-1].append(index)
            used += size
        return groups

    def _verify(
        self, questions: Sequence[Question], names: Sequence[str], labels: list[list[str]], group: Sequence[int]
    ) -> tuple[list[int], list[tuple[VerifiedSlot, ...]]]:
        """Verify one canvas's labels in context; returns its ids and, per question of `group`, its slots."""
        text, slots, owners = self._head, [], []
        for position, q_index in enumerate(group):
            question = questions[q_index]
            text += f"{names[q_index]}: "
            for before in _slot_texts(question):
                text += before
                slots.append(SlotSpec(len(text), tuple(labels[q_index]), question.kind == "choice"))
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

    @staticmethod
    def _system_text(questions: Sequence[PlannedQuestion], compact: bool) -> str:
        blocks = [SYSTEM_INTRO]
        for planned in questions:
            question = planned.question
            header = KIND_HEADERS[question.kind].format(top=len(question.options) - 1)
            title = f"Question {planned.name}" if compact else f"Question `{planned.name}`"
            lines = [f"[{title}] {header}"]
            if question.instructions is not None:
                lines.append(f"Instructions: {as_text(question.instructions)}")
            if question.kind == "box":
                lines.append(box.GUIDE)
            for label, option in zip(planned.labels, question.options, strict=False):  # a box has no options
                lines.append(f"{label}: {_describe(question, option.name, option.description)}")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)


def _slot_texts(question: Question) -> list[str]:
    """The text before each of the question's slots on its answer line: one empty gap, or a box's eight."""
    return box.slot_texts() if question.kind == "box" else [""]


def _describe(question: Question, name: str, description: JSONValue) -> str:
    if question.kind == "choice":
        return name if description is None else f"{name} — {as_text(description)}"
    if question.kind == "score":
        return as_text(description)
    default = "the statement holds" if name == "true" else "the statement does not hold"
    return default if description is None else as_text(description)


def _label_problem(question: Question | None, error: LabelError) -> InvalidRequest:
    if question is None:
        return InvalidRequest.at(("body", "questions"), f"the questions cannot be labelled in one canvas: {error}")
    loc = ("body", "questions", question.key, question.kind, "criteria")
    return InvalidRequest([FieldProblem(loc, f"question {question.key!r} cannot be labelled: {error}")])


def noisy_canvas(
    canvas: PlannedCanvas, questions: Sequence[PlannedQuestion], *, vocab_size: int, seed: int, read: int
) -> tuple[int, ...]:
    """The canvas with uniform random token ids at its slots.

    Each slot's noise is drawn from a generator seeded by (request seed, read
    number, question digest), so it follows the question's content, not its
    place: the same seed gives the same answer, and reordering or rotating
    other questions leaves it alone.
    """
    ids = list(canvas.ids)
    for q_index in canvas.questions:
        planned = questions[q_index]
        for index, slot in enumerate(planned.slots):
            material = f"{seed}|{read}|{planned.digest}" + (f"|{index}" if index else "")
            rng = random.Random(int.from_bytes(hashlib.sha256(material.encode()).digest()[:8], "big"))
            ids[slot.position] = rng.randrange(vocab_size)
    return tuple(ids)
