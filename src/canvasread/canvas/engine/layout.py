"""How a pass's rows are laid out: one flat run of tokens padded to a bucket, and attention groups over it.

Every token-wise piece of a layer (norms, projections, rotary, experts) runs
over the flat tokens, so rows of any prompts, lengths and kinds share one
shape: the bucket. Attention is the one row-wise piece: rows are grouped by
size (padding within a group stays under about twice the real work), and
each group gathers its rows' queries from the flat tokens and their keys
from the store (the past, by slot) and from the pass (their own tokens). The
masks are `masks.attention_mask`'s, with each row's keys laid out as its
padded past, then its padded new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from canvasread.canvas.engine.masks import attention_mask
from canvasread.canvas.engine.rows import Row

# Query-key pairs one attention group may hold (times the heads: its score tensor), about 1 GB in fp32 at 16 heads;
# its additive masks take the fold times that many elements per layer kind (256 MB in bf16 at a fold of 8).
GROUP_PAIRS = 1 << 24
# Keys per attention row are padded to a multiple of this (the memory-efficient kernel's mask alignment).
KEY_ALIGN = 16
# Padding a group may add beyond twice its real query-key pairs (small rows group freely).
GROUP_SLACK = 1 << 12


@dataclass(frozen=True)
class AttentionGroup:
    """Rows attended together: where their queries are in the flat pass, their past slots, and their masks."""

    queries: torch.Tensor  # [rows, new] flat token indices (padding points at token 0)
    past: torch.Tensor  # [rows, past] store slots (padding points at slot 0)
    real: torch.Tensor  # indices into the [rows * new] gathered queries of the real ones (no boolean mask: no sync)
    targets: torch.Tensor  # flat indices of the real queries, in gathered order
    masks: dict[str, torch.Tensor]  # per layer kind: additive, [rows, 1, fold * new, past + new]


@dataclass(frozen=True)
class PassLayout:
    """Device inputs of one pass of `tokens` (a bucket) flat tokens; `used` of them are real."""

    tokens: torch.Tensor
    positions: torch.Tensor
    is_canvas: torch.Tensor
    used: int
    written: torch.Tensor  # flat indices of the prompt tokens whose keys go to the store
    slots: torch.Tensor  # the store slots they go to
    starts: list[int]  # each row's first flat token
    groups: list[AttentionGroup]
    images: list[tuple[int, torch.Tensor]]  # (flat offset, features)
    signals: list[tuple[int, torch.Tensor]]  # (flat offset, self-conditioning of a canvas row)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class Attention:
    """What a layout needs of the model's attention: each layer kind's fold (query heads per key head), the
    sliding window, whether images attend both ways, and the masks' dtype and device."""

    folds: Mapping[str, int]
    window: int
    image_blocks: bool
    dtype: torch.dtype
    device: torch.device


def lay_out(rows: Sequence[Row], *, bucket: int, attention: Attention) -> PassLayout:
    """The flat layout of `rows` padded to `bucket` tokens, with masks for each layer kind of `attention`."""
    starts, cursor = [], 0
    for row in rows:
        starts.append(cursor)
        cursor += len(row.ids)
    if cursor > bucket:
        raise ValueError(f"{cursor} tokens do not fit a bucket of {bucket}")
    tokens = torch.zeros(bucket, dtype=torch.long)
    positions = torch.zeros(bucket, dtype=torch.long)
    is_canvas = torch.zeros(bucket, dtype=torch.bool)
    written: list[torch.Tensor] = []
    slots: list[torch.Tensor] = []
    for row, start in zip(rows, starts, strict=True):
        end = start + len(row.ids)
        tokens[start:end] = torch.tensor(list(row.ids), dtype=torch.long)
        positions[start:end] = torch.arange(len(row.past), len(row.past) + len(row.ids))
        is_canvas[start:end] = row.canvas
        if row.write is not None:
            written.append(torch.arange(start, end))
            slots.append(row.write)
    empty = torch.zeros(0, dtype=torch.long)
    placed = list(zip(rows, starts, strict=True))
    device = attention.device
    return PassLayout(
        tokens.to(device),
        positions.to(device),
        is_canvas.to(device),
        cursor,
        torch.cat([empty, *written]).to(device),
        torch.cat([empty, *slots]).to(device),
        starts,
        [_group(rows, starts, members, attention) for members in _grouping(rows)],
        [(start + offset, features) for row, start in placed for offset, features in row.images],
        [(start, row.self_conditioning) for row, start in placed if row.self_conditioning is not None],
    )


def _grouping(rows: Sequence[Row]) -> list[list[int]]:
    """Row indices in groups whose padded query-key pairs stay near their real ones and under GROUP_PAIRS."""
    order = sorted(range(len(rows)), key=lambda b: (len(rows[b].ids), len(rows[b].past)), reverse=True)
    groups: list[list[int]] = []
    real = widest_new = widest_keys = 0
    for b in order:
        new, keys = len(rows[b].ids), len(rows[b].past) + len(rows[b].ids)
        if groups:
            members = len(groups[-1]) + 1
            padded = members * max(widest_new, new) * max(widest_keys, keys)
            if padded <= 2 * (real + new * keys) + GROUP_SLACK and padded <= GROUP_PAIRS:
                groups[-1].append(b)
                real += new * keys
                widest_new, widest_keys = max(widest_new, new), max(widest_keys, keys)
                continue
        groups.append([b])
        real, widest_new, widest_keys = new * keys, new, keys
    return groups


def _group(rows: Sequence[Row], starts: Sequence[int], members: Sequence[int], attention: Attention) -> AttentionGroup:
    chosen = [rows[b] for b in members]
    max_new = max(len(row.ids) for row in chosen)
    # Keys padded to a multiple of KEY_ALIGN (past slots at slot 0, masked): the memory-efficient kernel's mask
    # rows must be aligned.
    max_past = -(-(max(len(row.past) for row in chosen) + max_new) // KEY_ALIGN) * KEY_ALIGN - max_new
    queries = torch.zeros(len(chosen), max_new, dtype=torch.long)
    past = torch.zeros(len(chosen), max_past, dtype=torch.long)
    valid = torch.zeros(len(chosen), max_new, dtype=torch.bool)
    for g, (row, b) in enumerate(zip(chosen, members, strict=True)):
        queries[g, : len(row.ids)] = torch.arange(starts[b], starts[b] + len(row.ids))
        past[g, : len(row.past)] = row.past
        valid[g, : len(row.ids)] = True
    prompt = [0 if row.canvas else len(row.ids) for row in chosen]
    lengths = torch.tensor([[len(row.past) for row in chosen], prompt, [len(row.ids) for row in chosen]])
    spans = [[(offset, len(features)) for offset, features in row.images] for row in chosen]
    device = attention.device
    lengths = lengths.to(device)
    masks = {}
    for kind, fold in attention.folds.items():
        allowed = attention_mask(
            sliding=kind == "sliding_attention",
            window=attention.window,
            lengths=lengths,
            max_past=max_past,
            max_new=max_new,
            image_spans=spans if attention.image_blocks else [],
        )
        additive = torch.zeros(allowed.shape, dtype=attention.dtype, device=device).masked_fill_(~allowed, -torch.inf)
        masks[kind] = additive.repeat(1, 1, fold, 1)
    flat_valid = valid.reshape(-1)
    return AttentionGroup(
        queries.to(device),
        past.to(device),
        flat_valid.nonzero().squeeze(1).to(device),
        queries.reshape(-1)[flat_valid].to(device),
        masks,
    )
