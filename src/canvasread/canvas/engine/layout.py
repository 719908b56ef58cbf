"""How a pass's rows are laid out: one flat run of tokens padded to a bucket, and attention groups over it.

Every token-wise piece of a layer (norms, projections, rotary, experts) runs
over the flat tokens, so rows of any prompts, lengths and kinds share one
shape: the bucket. Attention is the one row-wise piece: rows are grouped by
size (padding within a group stays under about twice the real work), and
each group gathers its rows' queries from the flat tokens and their keys
from the store (the past, by slot) and from the pass (their own tokens). The
masks are `masks.attention_mask`'s, with each row's keys laid out as its
padded past, then its padded new tokens.

Grouped-query attention runs folded: each key head's query heads are
stacked along the query axis, so keys and values are never copied per query
head. A group carries, per layer kind, the rows of the pass's queries in that
layout, where its real queries come back out, and its mask laid out for it,
additive (0 or -inf in the model's dtype), so no layer converts it again.

A small pass attends flat instead (`Buckets.flat_shape`): one attention of
every token over the rows' past keys (laid out row after row, padded to a
past bucket) and the pass's own keys, masked to each token's own row
(`masks.flat_mask`). Its inputs (`FlatInputs`: the token ids and roles, the
past keys) have the same shapes for any rows of one (tokens, past) bucket,
so on a GPU the whole pass replays one graph, the embedding and the masks
built inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from canvasread.canvas.engine.masks import attention_mask, flat_mask
from canvasread.canvas.engine.rows import Row

# Query-key pairs one attention group may hold (times the heads: its score tensor), about 1 GB in fp32 at 16 heads;
# its additive masks take the fold times that many elements per layer kind (256 MB in bf16 at a fold of 8).
GROUP_PAIRS = 1 << 24
# Keys per attention row are padded to a multiple of this (the memory-efficient kernel's mask alignment).
KEY_ALIGN = 16
# A group's padded query-key pairs stay within this many times its real ones, plus GROUP_SLACK (small rows group
# freely): fewer groups launch less, tighter ones compute less padding.
GROUP_PADDING = 2.0
GROUP_SLACK = 1 << 12


@dataclass(frozen=True)
class AttentionGroup:
    """Rows attended together: where their tokens are in the flat pass, their past slots, and, per layer kind,
    their masks and where each query head's rows go in and come out in the folded layout."""

    queries: torch.Tensor  # [rows, new] flat token indices (padding points at token 0)
    past: torch.Tensor  # [rows, past] store slots (padding points at slot 0)
    masks: dict[str, torch.Tensor]  # per layer kind: additive, [rows, 1, fold * new, past + new]
    folded: dict[str, torch.Tensor]  # per kind: [rows, kv_heads, fold * new] rows of the pass's [tokens * heads]
    picks: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per kind: the real queries' (row, key
    # head, folded position) in the attention's output (index tensors: no boolean mask, no sync)
    targets: dict[str, torch.Tensor]  # per kind: their rows of the pass's [tokens * heads]


@dataclass(frozen=True)
class FlatInputs:
    """What a flat pass's graph reads besides the self-conditioning (the module docstring's last paragraph): its
    tokens, their roles and the past keys they attend to, so the embedding runs inside the graph too. Every
    token's keys are written to the store, those no prompt keeps to its scratch slot, so the writes have one
    shape too."""

    past: torch.Tensor  # [3, past]: each past key's store slot (padding: scratch), row (-1: padding), position
    tokens: torch.Tensor  # [6, tokens]: each token's row (-1: padding), position, prompt total, prompt (1) or
    # canvas (0), the store slot its keys go to, and its token id

    def to(self, device: torch.device) -> FlatInputs:
        return FlatInputs(self.past.to(device), self.tokens.to(device))

    @property
    def ids(self) -> torch.Tensor:
        return self.tokens[5]

    @property
    def positions(self) -> torch.Tensor:
        return self.tokens[1]

    @property
    def is_canvas(self) -> torch.Tensor:
        """The canvas tokens (not padding, not a prompt's)."""
        return (self.tokens[3] == 0) & (self.tokens[0] >= 0)


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
    groups: list[AttentionGroup]  # none when the pass attends flat
    flat: FlatInputs | None
    images: list[tuple[int, torch.Tensor]]  # (flat offset, features)
    signals: list[tuple[int, torch.Tensor]]  # (flat offset, self-conditioning of a canvas row)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class Attention:
    """What a layout needs of the model's attention: each layer kind's (query heads, key heads), the sliding
    window, whether images attend both ways, and the masks' dtype and device."""

    heads: Mapping[str, tuple[int, int]]
    window: int
    image_blocks: bool
    dtype: torch.dtype
    device: torch.device


def lay_out(
    rows: Sequence[Row], *, bucket: int, attention: Attention, flat: tuple[int, int] | None = None
) -> PassLayout:
    """The flat layout of `rows` padded to `bucket` tokens, with masks for each layer kind of `attention`; with
    `flat` (a past bucket and the store's scratch slot), the inputs of one flat attention instead of groups."""
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
        if row.write is not None and flat is None:
            written.append(torch.arange(start, end))
            slots.append(row.write)
    empty = torch.zeros(0, dtype=torch.long)
    placed = list(zip(rows, starts, strict=True))
    device = attention.device
    inputs = _flat(rows, starts, tokens, positions, *flat).to(device) if flat is not None else None
    # A flat pass's token rows are its inputs' (one copy to the device, what its graph reads); a grouped pass's
    # are copied on their own.
    return PassLayout(
        inputs.ids if inputs is not None else tokens.to(device),
        inputs.positions if inputs is not None else positions.to(device),
        inputs.is_canvas if inputs is not None else is_canvas.to(device),
        cursor,
        torch.cat([empty, *written]).to(device),
        torch.cat([empty, *slots]).to(device),
        starts,
        [] if inputs is not None else [_group(rows, starts, members, attention) for members in _grouping(rows)],
        inputs,
        [(start + offset, features) for row, start in placed for offset, features in row.images],
        [(start, row.self_conditioning) for row, start in placed if row.self_conditioning is not None],
    )


def flat_masks(flat: FlatInputs, attention: Attention) -> dict[str, torch.Tensor]:
    """Per layer kind, a flat pass's additive mask repeated once per folded head: [1, 1, fold * tokens, keys]."""
    masks = {}
    for kind, (heads, kv_heads) in attention.heads.items():
        allowed = flat_mask(
            past=flat.past[1:], tokens=flat.tokens[:4], sliding=kind == "sliding_attention", window=attention.window
        )
        masks[kind] = _additive(allowed, attention.dtype).repeat(heads // kv_heads, 1)[None, None]
    return masks


def padding_flat(tokens: int, past: int, scratch: int, device: torch.device) -> FlatInputs:
    """The inputs of a flat pass of `tokens` tokens over `past` past keys that are all padding (what `lay_out`
    fills in, and what start-up captures a flat shape over): writes and past keys at the store's scratch slot,
    token id 0."""
    return FlatInputs(
        torch.tensor([[scratch], [-1], [0]], device=device).repeat(1, past),
        torch.tensor([[-1], [0], [0], [0], [scratch], [0]], device=device).repeat(1, tokens),
    )


def _flat(
    rows: Sequence[Row],
    starts: Sequence[int],
    ids: torch.Tensor,
    positions: torch.Tensor,
    past_bucket: int,
    scratch: int,
) -> FlatInputs:
    """A flat pass's inputs on the CPU: each row's past keys after the last row's, each token's id and role."""
    flat = padding_flat(len(positions), past_bucket, scratch, torch.device("cpu"))
    past, tokens = flat.past, flat.tokens
    tokens[1] = positions
    tokens[5] = ids
    cursor = 0
    for number, (row, start) in enumerate(zip(rows, starts, strict=True)):
        cached, end = len(row.past), start + len(row.ids)
        if cursor + cached > past_bucket:
            raise ValueError(f"{cursor + cached} past keys do not fit a flat past bucket of {past_bucket}")
        past[0, cursor : cursor + cached] = row.past
        past[1, cursor : cursor + cached] = number
        past[2, cursor : cursor + cached] = torch.arange(cached)
        cursor += cached
        tokens[0, start:end] = number
        tokens[2, start:end] = cached + (0 if row.canvas else len(row.ids))
        tokens[3, start:end] = 0 if row.canvas else 1
        if row.write is not None:
            tokens[4, start:end] = row.write
    return flat


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `allowed`, -inf elsewhere, in `dtype`: added to the scores as they are."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, -torch.inf)


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
            if padded <= GROUP_PADDING * (real + new * keys) + GROUP_SLACK and padded <= GROUP_PAIRS:
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
    both_ways = attention.image_blocks
    spans = [[(offset, len(features)) for offset, features in row.images] for row in chosen] if both_ways else []
    device = attention.device
    lengths = lengths.to(device)
    masks, folded, picks, targets = {}, {}, {}, {}
    for kind, (heads, kv_heads) in attention.heads.items():
        allowed = attention_mask(
            sliding=kind == "sliding_attention",
            window=attention.window,
            lengths=lengths,
            max_past=max_past,
            max_new=max_new,
            image_spans=spans,
        )
        masks[kind] = _additive(allowed, attention.dtype).repeat(1, 1, heads // kv_heads, 1)
        rows_in, in_row, key_head, position, rows_out = _head_rows(queries, valid, heads, kv_heads)
        folded[kind] = rows_in.to(device)
        picks[kind] = (in_row.to(device), key_head.to(device), position.to(device))
        targets[kind] = rows_out.to(device)
    return AttentionGroup(queries.to(device), past.to(device), masks, folded, picks, targets)


def _head_rows(
    queries: torch.Tensor, valid: torch.Tensor, heads: int, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For queries [rows, new] (flat tokens; `valid`: real) of `heads` query heads over `kv_heads` key heads:
    the rows of the pass's [tokens * heads] queries in the folded layout [rows, kv_heads, fold * new] (query head
    g * fold + f of token i at (g, f * new + i)), then the real queries' (row, key head, folded position) in it
    and the [tokens * heads] rows they go back to."""
    rows, new = queries.shape
    fold = heads // kv_heads
    head = torch.arange(kv_heads)[:, None] * fold + torch.arange(fold)  # [kv_heads, fold]
    every = queries[:, None, None, :] * heads + head[None, :, :, None]  # [rows, kv_heads, fold, new]
    row, key_head, within, token = valid[:, None, None, :].expand(rows, kv_heads, fold, new).nonzero(as_tuple=True)
    position = within * new + token
    return every.reshape(rows, kv_heads, fold * new), row, key_head, position, every[row, key_head, within, token]
