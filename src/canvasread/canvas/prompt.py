"""The prompt of a canvas read: its wording, and its token ids with every image in place.

A prompt is the model's chat template with thinking off: a system turn that
lists questions with their labels (option names and descriptions beside
them), the state as the user turn — followed by the question itself in a
per-question read, as vLLM's own reader asks — and, by default, the empty
thought block after the generation prompt. Its tokens up to the state are the
cacheable prefix: requests that ask the same questions share them.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from canvasread.canvas.reader import PromptImage
from canvasread.canvas.tokenizer import Tokenizer
from canvasread.errors import InvalidRequest
from canvasread.kinds import kind_of
from canvasread.kinds.base import as_text
from canvasread.types import ImageAsset, Question

THOUGHT_BLOCK = "<|channel>thought\n<channel|>"
# Stands for the state while the prefix is found: a text no state or question contains.
STATE_MARKER = "\x00state\x00"
# System turns whose prefix ids are kept: one per question set in use (a few hundred ids each).
PREFIXES_KEPT = 1024

LINES_INTRO = (
    "You are a decision model. The user's message is the state. Answer every question below about the state "
    "by choosing exactly one of the labels listed for that question.\n"
    "Write one line per question, in the order given: the question's name, a colon, a space, then the label, "
    "and nothing else."
)
BARE_INTRO = (
    "You are a decision model. The user's message is the state, then one question about it. Answer it by "
    "choosing exactly one of the labels listed for the question, and write that label and nothing else."
)


@dataclass(frozen=True)
class PromptText:
    """A prompt's wording around the state: the system turn, and what follows the state in the user turn."""

    system: str
    after_state: str = ""


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt's token ids; the first `prefix_length` are shared by every state (never an image)."""

    ids: tuple[int, ...]
    prefix_length: int
    images: tuple[PromptImage, ...] = ()


@dataclass(frozen=True)
class ImageTokens:
    """How the model writes an image into its prompt: begin marker, `count` soft tokens, end marker."""

    begin_id: int
    token_id: int
    end_id: int
    count: Callable[[ImageAsset], int]


def question_block(question: Question, name: str, labels: Iterable[str], *, compact: bool) -> str:
    """How the prompt asks one question: its title and kind, its instructions, and each label's meaning."""
    kind = kind_of(question.kind)
    title = f"Question {name}" if compact else f"Question `{name}`"
    lines = [f"[{title}] {kind.header.format(top=len(question.options) - 1)}"]
    if question.instructions is not None:
        lines.append(f"Instructions: {as_text(question.instructions)}")
    lines += [kind.guide] if kind.guide is not None else []
    for label, option in zip(labels, question.options, strict=False):  # a box has labels but no options
        lines.append(f"{label}: {kind.describe(option)}")
    return "\n".join(lines)


class PromptEncoder:
    """Turns a prompt's wording and a state into token ids, the thought block placed as the read layout says."""

    def __init__(self, tokenizer: Tokenizer, images: ImageTokens | None, *, thought_in_prompt: bool) -> None:
        self.tokenizer = tokenizer
        self.images = images
        self.thought_in_prompt = thought_in_prompt
        # The prefix depends on the system turn alone, and requests of one question set share it: rendering the
        # chat template and tokenising it again for each was about 40% of a `standard` request's planning.
        self.prefix_ids = functools.lru_cache(maxsize=PREFIXES_KEPT)(self._prefix_ids)

    def check_assets(self, texts: Iterable[str], assets: Mapping[str, ImageAsset]) -> None:
        """Refuse images this model cannot see, and an asset no prompt mentions (the model would never see it)."""
        if not assets:
            return
        if self.images is None:
            raise InvalidRequest.at(("assets",), "this model cannot see images")
        pattern = _names_pattern(assets)
        mentioned = {name for text in texts for name in pattern.findall(text)}
        unused = sorted(set(assets) - mentioned)
        if unused:
            raise InvalidRequest.at(
                ("assets", unused[0]),
                "the asset is not referenced in the state, instructions or criteria, so the model would never see it",
            )

    def encode_all(
        self, prompts: Sequence[PromptText], state: str, assets: Mapping[str, ImageAsset]
    ) -> tuple[EncodedPrompt, ...]:
        """Every prompt of a request with the state in place; each asset must appear in at least one of them."""
        texts = [self.text(prompt, state) for prompt in prompts]
        self.check_assets(texts, assets)
        return tuple(self._encode(prompt, text, assets) for prompt, text in zip(prompts, texts, strict=True))

    def text(self, prompt: PromptText, state: str) -> str:
        """The whole prompt; it ends with the empty thought block unless the canvas carries it."""
        rendered = self.tokenizer.chat_prompt(prompt.system, state + prompt.after_state)
        bare = rendered.removesuffix(THOUGHT_BLOCK)
        return bare + THOUGHT_BLOCK if self.thought_in_prompt else bare

    def _encode(self, prompt: PromptText, text: str, assets: Mapping[str, ImageAsset]) -> EncodedPrompt:
        ids, images = self._ids(text, assets)
        prefix_ids = self.prefix_ids(prompt.system)
        prefix_length = next(
            (i for i, (a, b) in enumerate(zip(prefix_ids, ids, strict=False)) if a != b),
            min(len(prefix_ids), len(ids)),
        )
        if images:  # the shared, cacheable prefix never holds an image (all soft tokens share one id)
            prefix_length = min(prefix_length, images[0].start - 1)
        return EncodedPrompt(tuple(ids), prefix_length, images)

    def _prefix_ids(self, system: str) -> tuple[int, ...]:
        """The ids of every prompt with this system turn up to the state (the prompt cut where it starts)."""
        marked = self.tokenizer.chat_prompt(system, STATE_MARKER)
        return tuple(self.tokenizer.encode(marked.split(STATE_MARKER)[0]))

    def _ids(self, text: str, assets: Mapping[str, ImageAsset]) -> tuple[list[int], tuple[PromptImage, ...]]:
        """Token ids of the prompt, each image the text mentions replaced by the model's image block."""
        if not assets:
            return self.tokenizer.encode(text), ()
        assert self.images is not None, "check_assets() refuses images for a model that cannot see them"
        pattern = _names_pattern(assets)
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


def _names_pattern(assets: Mapping[str, ImageAsset]) -> re.Pattern[str]:
    """Matches asset names in text, longest first, so `img10` is never read as `img1`."""
    return re.compile("|".join(re.escape(name) for name in sorted(assets, key=len, reverse=True)))
