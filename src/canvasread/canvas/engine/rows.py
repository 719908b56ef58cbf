"""The data of one fused pass: the rows asked for, their padded shape, the device inputs and the outputs.

A leaf of the engine: the layer math (`layers`), the CUDA graphs (`graphs`)
and the runner all speak in these types, so none of them imports another's
internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PromptKV:
    """Keys and values of an encoded prompt (or prefix), per layer, shaped [kv_heads, length, head_dim]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def prefix(self, length: int) -> PromptKV:
        """A copy of the first `length` positions (a copy, so the full prompt's memory can be freed)."""
        return PromptKV(
            [k[:, :length].clone() for k in self.keys], [v[:, :length].clone() for v in self.values], length
        )


@dataclass(frozen=True)
class Row:
    """One unit of work in a pass: continue `past` with `prompt_ids`, then read `canvas_ids` (if any).

    `slot_positions` index into the canvas; `label_ids[i]` are the token ids
    whose log-probabilities are wanted at slot i. With `keep_kv` the KV of
    past + new prompt tokens is returned for caching. `images` puts each
    image's features (vision tower output) over its soft tokens, given as
    offsets into `prompt_ids`. `self_conditioning` is the previous denoising
    step's soft embeddings ([canvas, hidden]; None: zeros, a first step), and
    `canvas_hidden` asks for the final hidden states of every canvas position
    (after the norm) for the next denoising step (`steps.py`).
    """

    past: PromptKV | None
    prompt_ids: Sequence[int]
    canvas_ids: Sequence[int]
    slot_positions: Sequence[int]
    label_ids: Sequence[Sequence[int]]
    keep_kv: bool = False
    images: Sequence[tuple[int, torch.Tensor]] = ()
    self_conditioning: torch.Tensor | None = None
    canvas_hidden: bool = False


@dataclass
class RowOutput:
    """Per slot: the full-vocabulary log-probabilities of its label ids (temperature 1); `canvas_hidden` if asked."""

    label_logprobs: list[torch.Tensor]
    kv: PromptKV | None
    canvas_hidden: torch.Tensor | None = None


@dataclass(frozen=True)
class PassShape:
    """The padded size of one pass: rows, new tokens per row, cached tokens per row."""

    batch: int
    new: int
    past: int

    @classmethod
    def of(cls, rows: Sequence[Row]) -> PassShape:
        return cls(
            len(rows),
            max(len(r.prompt_ids) + len(r.canvas_ids) for r in rows),
            max(r.past.length if r.past is not None else 0 for r in rows),
        )


@dataclass
class PassInputs:
    """Device tensors of one pass (`masks` per layer kind); `past` is a shared static prefix, `images` overlays.

    `self_conditioning` is [batch, new, hidden] soft embeddings at canvas positions (None: zeros everywhere).
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    is_canvas: torch.Tensor
    masks: dict[str, torch.Tensor]
    real_tokens: torch.Tensor
    max_past: int
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    images: list[tuple[int, int, torch.Tensor]] | None = None
    self_conditioning: torch.Tensor | None = None


# What the layer loop hands back: the last hidden states [batch, new, width] and each layer's new keys and
# values [batch, kv_heads, new, head_dim].
PassOutputs = tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]
