"""Labels: the single tokens a canvas slot may hold, and the check that they stay single in context.

A slot is read as a distribution over its question's label token ids, so
every label must be exactly one token *where it stands*: tokenizing the
canvas with each label in turn must change exactly one position and never the
length. Choice labels come from an ordered pool of short strings that the
tokenizer itself keeps whole (A–Z first, then AA, AB, …), so a question can
have up to 255 options where djev stopped at 26. A label that merges with its
neighbours is replaced by the next one in the pool.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Sequence
from dataclasses import dataclass

from canvasread.canvas.tokenizer import Tokenizer
from canvasread.kinds.base import Kind

# Plenty for 255 options even after some candidates fail in context.
POOL_CANDIDATES = tuple(
    [*string.ascii_uppercase, *("".join(pair) for pair in itertools.product(string.ascii_uppercase, repeat=2))]
)


class LabelError(ValueError):
    """No verified single-token label set exists for a question; `slot` says which, when known."""

    def __init__(self, message: str, slot: int | None = None) -> None:
        super().__init__(message)
        self.slot = slot


def choice_label_pool(tokenizer: Tokenizer) -> tuple[str, ...]:
    """Candidates that are one token after `": "` and before a newline, in pool order (compute once per tokenizer)."""
    reference = len(tokenizer.encode("x: A\n"))
    encoded = tokenizer.encode_batch([f"x: {candidate}\n" for candidate in POOL_CANDIDATES])
    return tuple(c for c, ids in zip(POOL_CANDIDATES, encoded, strict=True) if len(ids) == reference)


def initial_labels(kind: Kind, option_names: Sequence[str], pool: Sequence[str]) -> list[str]:
    """The labels a question starts with, as its kind gives them (choices: the pool's first, in option order)."""
    labels = kind.labels(option_names, pool)
    if len(labels) < len(option_names):
        raise LabelError(f"{len(option_names)} options but only {len(pool)} single-token labels exist")
    return labels


@dataclass(frozen=True)
class SlotSpec:
    """Where a slot's label sits in the canvas text, and the labels it may take."""

    start: int
    labels: tuple[str, ...]
    relabel: bool


@dataclass(frozen=True)
class VerifiedSlot:
    """A slot's canvas position and label token ids; `other_ids[i]` is label i's other whitespace form, if read.

    The other form of a label is its token with a leading space where the
    canvas has none, or without one where it has (`" A"` / `"A"`), when that is
    a single token of its own; -1 where it is not.
    """

    position: int
    labels: tuple[str, ...]
    label_ids: tuple[int, ...]
    other_ids: tuple[int, ...] = ()

    @property
    def read_ids(self) -> tuple[int, ...]:
        """The ids whose logprobs a read needs: the labels, then the other forms that exist."""
        return self.label_ids + tuple(i for i in self.other_ids if i >= 0)

    def split(self, logprobs: Sequence[float]) -> tuple[Sequence[float], list[float | None]]:
        """`logprobs` of `read_ids` as (the labels', each label's other form's or None)."""
        others = iter(logprobs[len(self.label_ids) :])
        return logprobs[: len(self.label_ids)], [next(others) if i >= 0 else None for i in self.other_ids]


def other_forms(tokenizer: Tokenizer, slot: VerifiedSlot) -> VerifiedSlot:
    """`slot` with `other_ids` filled: each label's other whitespace form, when it is one token of its own."""
    taken = set(slot.label_ids)
    others = []
    for label, token in zip(slot.labels, slot.label_ids, strict=True):
        spaced = tokenizer.decode([token]).startswith(" ")
        ids = tokenizer.encode(label if spaced else f" {label}")
        single = len(ids) == 1 and ids[0] not in taken and tokenizer.decode(ids).strip() == label
        others.append(ids[0] if single else -1)
        taken.update(ids[:1] if single else [])
    return VerifiedSlot(slot.position, slot.labels, slot.label_ids, tuple(others))


def _render(text: str, slots: Sequence[SlotSpec], chosen: Sequence[str]) -> str:
    """`text` holds an empty gap at each slot start; fill each gap with its chosen label."""
    pieces, cursor = [], 0
    for slot, label in zip(slots, chosen, strict=True):
        pieces += [text[cursor : slot.start], label]
        cursor = slot.start
    pieces.append(text[cursor:])
    return "".join(pieces)


def verify_canvas(
    tokenizer: Tokenizer, text: str, slots: Sequence[SlotSpec], pool: Sequence[str]
) -> tuple[list[int], list[VerifiedSlot]]:
    """Check every label of every slot in context, relabelling from `pool` where allowed.

    `text` is the canvas text with an empty gap at each slot (slots sorted by
    start). Returns the token ids of the canvas with each slot's first label
    and, per slot, its token position and label token ids.
    """
    current = [list(slot.labels) for slot in slots]
    rejected: list[set[str]] = [set() for _ in slots]
    for _ in range(len(pool) + 2):
        base_text = _render(text, slots, [labels[0] for labels in current])
        base_ids = tokenizer.encode(base_text)
        variants: list[str] = []
        owners: list[tuple[int, int]] = []
        for index, labels in enumerate(current):
            for choice_index in range(1, len(labels)):
                chosen = [ls[0] for ls in current]
                chosen[index] = labels[choice_index]
                variants.append(_render(text, slots, chosen))
                owners.append((index, choice_index))
        encoded = tokenizer.encode_batch(variants) if variants else []
        positions: list[set[int]] = [set() for _ in slots]
        failures: dict[int, set[int]] = {}
        alternative_ids: dict[tuple[int, int], int] = {}
        for (index, choice_index), ids in zip(owners, encoded, strict=True):
            changed = [p for p, (a, b) in enumerate(zip(base_ids, ids, strict=False)) if a != b]
            label = current[index][choice_index]
            if len(ids) != len(base_ids) or len(changed) != 1 or not _is_label(tokenizer, ids[changed[0]], label):
                failures.setdefault(index, set()).add(choice_index)
                continue
            positions[index].add(changed[0])
            alternative_ids[(index, choice_index)] = ids[changed[0]]
        for index, found in enumerate(positions):
            base_is_suspect = not found and len(current[index]) > 1
            if base_is_suspect or (
                len(found) == 1 and not _is_label(tokenizer, base_ids[next(iter(found))], current[index][0])
            ):
                failures.setdefault(index, set()).add(0)
        for index, found in enumerate(positions):
            if len(found) > 1:
                failures.setdefault(index, set()).update(range(len(current[index])))
        if not failures:
            return base_ids, _verified(tokenizer, base_text, base_ids, slots, current, positions, alternative_ids)
        for index, bad in failures.items():
            rejected[index].update(current[index][i] for i in bad)
            try:
                current[index] = _relabel(slots[index], current[index], bad, pool, rejected[index])
            except LabelError as error:
                raise LabelError(str(error), slot=index) from None
    raise LabelError("labels kept merging with their neighbours")


def _is_label(tokenizer: Tokenizer, token: int, label: str) -> bool:
    """The token is the label itself (a leading space aside), not the label fused with its neighbours."""
    return tokenizer.decode([token]).strip() == label


def _relabel(slot: SlotSpec, labels: list[str], bad: set[int], pool: Sequence[str], rejected: set[str]) -> list[str]:
    """Swap the labels that failed for pool labels neither in use nor rejected before (choice questions only)."""
    if not slot.relabel:
        failed = ", ".join(repr(labels[i]) for i in sorted(bad))
        raise LabelError(f"labels {failed} are not single tokens in this canvas")
    used = set(labels) | rejected
    spare = iter(label for label in pool if label not in used)
    replaced = list(labels)
    for choice_index in sorted(bad):
        try:
            replaced[choice_index] = next(spare)
        except StopIteration:
            raise LabelError("ran out of single-token labels") from None
    return replaced


def _verified(
    tokenizer: Tokenizer,
    base_text: str,
    base_ids: Sequence[int],
    slots: Sequence[SlotSpec],
    current: Sequence[Sequence[str]],
    positions: Sequence[set[int]],
    alternative_ids: dict[tuple[int, int], int],
) -> list[VerifiedSlot]:
    """Locate slots that had no alternative to compare against (one-option questions) by character offsets."""
    _, offsets = tokenizer.encode_with_offsets(base_text)
    result = []
    shift = 0
    for index, (slot, labels) in enumerate(zip(slots, current, strict=True)):
        start = slot.start + shift
        end = start + len(labels[0])
        shift += len(labels[0])
        if positions[index]:
            position = next(iter(positions[index]))
        else:
            covering = [p for p, (a, b) in enumerate(offsets) if b == end and a in (start, start - 1)]
            if len(covering) != 1 or not _is_label(tokenizer, base_ids[covering[0]], labels[0]):
                raise LabelError(f"label {labels[0]!r} is not a single token in this canvas", slot=index)
            position = covering[0]
        ids = [base_ids[position]] + [alternative_ids[(index, c)] for c in range(1, len(labels))]
        if len(set(ids)) != len(ids):
            raise LabelError("two labels of one question map to the same token", slot=index)
        result.append(VerifiedSlot(position, tuple(labels), tuple(ids)))
    return result
