"""Pinned multi-step reads: what happens to a canvas between two decoder passes.

A read of `steps` steps runs the decoder `steps` times over its prompt's KV
(encoded once, in the store). Between passes the canvas goes through one
denoising step of transformers' DiffusionGemma generation loop driven with
`max_denoising_steps = steps` (`sampling.draw`: temperature, samples,
entropy-bound acceptance, renoise, self-conditioning), and then every
position but the slots is set back to the read's canvas (the pin:
transformers has no pins, this is the one step it does not take). The
pinned positions' scaled logits still become the next pass's
self-conditioning, as in transformers' decoder.

The loop's adaptive stop (stable and confident canvas) is not taken: a read
runs all its steps, the last one read-only (temperature 1, at the slots).
"""

from __future__ import annotations

from typing import Any

import torch

from canvasread.canvas.engine.sampling import Scaled, Schedule, draw, soft_embeddings
from canvasread.canvas.reader import CanvasRead


class Denoising:
    """One multi-step read in flight: its current canvas, self-conditioning and random generator, stepped on the
    checkpoint's `schedule` driven with the read's own `steps`."""

    def __init__(self, read: CanvasRead, schedule: Schedule, device: torch.device) -> None:
        self.read = read
        self.schedule = schedule
        self.done = 0  # decoder passes run so far
        self.signal: torch.Tensor | None = None  # the soft embeddings of the last pass ([canvas, hidden])
        self.generator = torch.Generator(device=device).manual_seed(read.seed)
        template = torch.tensor(read.canvas_ids, dtype=torch.long, device=device)
        self.canvas = template
        self._template = template
        pinned = torch.ones(len(read.canvas_ids), dtype=torch.bool, device=device)
        pinned[[slot.position for slot in read.slots]] = False
        self._pinned = pinned

    @property
    def last(self) -> bool:
        """Whether the next pass is the read-only one."""
        return self.done == self.read.steps - 1

    def canvas_ids(self) -> list[int]:
        return [int(token) for token in self.canvas.tolist()]

    @property
    def temperature(self) -> float:
        """The temperature of the step after the next pass."""
        steps = self.read.steps
        return self.schedule.temperature(steps - self.done, steps)

    @torch.inference_mode()
    def advance(self, scaled: Scaled, embed: Any) -> None:
        """Take the denoising step after a pass whose canvas logits, at `temperature`, are `scaled`."""
        step = draw(scaled, self.schedule.entropy_bound, self.generator)
        self.canvas = torch.where(self._pinned, self._template, step.canvas)
        self.signal = soft_embeddings(step.mixture, embed)
        self.done += 1
