"""The units of a fused pass: a `Row` asked for and what it gives back.

A leaf of the engine: the layout (`layout`), the layer math (`layers`), the
runner and the reader all speak in these types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Row:
    """One unit of work in a pass: tokens `ids` after the stored keys at `past` (slot indices, CPU int64).

    A prompt row (`write` given) encodes its tokens causally and writes their
    keys and values to the store at the slots `write`; a canvas row (`write`
    None) reads its tokens bidirectionally and writes nothing. Both see every
    stored key at `past`, even one written earlier in the same pass.
    `slot_positions` index into a canvas row's tokens; `label_ids[i]` are the
    token ids whose log-probabilities are wanted at slot i. `images` puts
    each image's features (vision tower output) over its soft tokens, given
    as offsets into `ids`. `self_conditioning` is the previous denoising
    step's soft embeddings ([canvas, hidden]; None: zeros, a first step), and
    `canvas_hidden` asks for the final hidden states of every canvas token
    (after the norm) for the next denoising step (`steps.py`).
    """

    past: torch.Tensor
    ids: Sequence[int]
    write: torch.Tensor | None = None
    slot_positions: Sequence[int] = ()
    label_ids: Sequence[Sequence[int]] = ()
    images: Sequence[tuple[int, torch.Tensor]] = ()
    self_conditioning: torch.Tensor | None = None
    canvas_hidden: bool = False

    @property
    def canvas(self) -> bool:
        return self.write is None


@dataclass
class RowOutput:
    """Per slot: the full-vocabulary log-probabilities of its label ids (temperature 1); `canvas_hidden` if asked."""

    label_logprobs: list[torch.Tensor]
    canvas_hidden: torch.Tensor | None = None


NO_PAST = torch.zeros(0, dtype=torch.int64)
