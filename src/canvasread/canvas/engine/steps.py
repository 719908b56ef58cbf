"""Pinned multi-step reads: what happens to a canvas between two decoder passes.

A read of `steps` steps runs the decoder `steps` times over its prompt's KV
(encoded once, in the store). Between passes the canvas goes through one denoising step of
transformers' DiffusionGemma generation loop (`_denoising_step` with its
`EntropyBoundSampler` and linear temperature schedule, driven with
`max_denoising_steps = steps`):

1. the logits of every canvas position are divided by the schedule's
   temperature `t_min + (t_max - t_min) * remaining / steps`, where
   `remaining` counts down from `steps` (the loop's `cur_step`);
2. a token is sampled at every position from the scaled softmax, then the
   positions are sorted by the entropy of that softmax and the longest
   lowest-entropy run whose entropy sum, less its largest term, stays within
   the entropy bound keeps its samples; every other position is renoised with
   a uniform token id (the sample is drawn first, the renoise second, both
   from the read's generator, as the loop draws them from torch's);
3. every position but the slots is set back to the read's canvas (the pin:
   transformers has no pins, this is the one step it does not take);
4. the scaled logits of every position, pinned ones too, become the next
   pass's self-conditioning: softmax in the embedding dtype, times the
   embedding matrix, times the embedding scale (transformers' decoder).

The loop's adaptive stop (stable and confident canvas) is not taken: a read
runs all its steps, the last one read-only (temperature 1, at the slots).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from canvasread.canvas.reader import CanvasRead


@dataclass(frozen=True)
class Schedule:
    """The checkpoint's temperature schedule and entropy bound, as transformers' `generate` resolves them."""

    t_min: float
    t_max: float
    entropy_bound: float

    @classmethod
    def of(cls, model: Any) -> Schedule:
        # generate()'s own resolution: the checkpoint's generation_config.json over transformers' defaults,
        # so a multi-step read never disagrees with generate() about the schedule.
        config, _ = model._prepare_generation_config(None)
        return cls(float(config.t_min), float(config.t_max), float(config.sampler_config.entropy_bound))

    def temperature(self, remaining: int, steps: int) -> float:
        return self.t_min + (self.t_max - self.t_min) * (remaining / steps)


class Denoising:
    """One multi-step read in flight: its current canvas, self-conditioning and random generator."""

    def __init__(self, read: CanvasRead, device: torch.device) -> None:
        self.read = read
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

    @torch.inference_mode()
    def advance(self, logits: torch.Tensor, schedule: Schedule, embed: Any) -> None:
        """Take the denoising step after a pass whose canvas logits (fp32, softcapped) are `logits`."""
        steps = self.read.steps
        scaled = logits / schedule.temperature(steps - self.done, steps)
        probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        sampled = torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(-1)
        entropy = torch.distributions.Categorical(logits=scaled).entropy()  # type: ignore[no-untyped-call]
        ordered, order = torch.sort(entropy)
        kept = torch.cumsum(ordered, dim=-1) - ordered <= schedule.entropy_bound
        accepted = torch.zeros_like(kept).scatter(0, order, kept)
        noise = torch.randint(
            0, logits.shape[-1], (1, logits.shape[0]), generator=self.generator, device=logits.device
        ).squeeze(0)
        canvas = torch.where(accepted, sampled, noise)
        self.canvas = torch.where(self._pinned, self._template, canvas)
        self.signal = soft_embeddings(scaled, embed)
        self.done += 1


def soft_embeddings(scaled: torch.Tensor, embed: Any) -> torch.Tensor:
    """The self-conditioning input transformers' decoder builds from the previous step's scaled logits."""
    weight = embed.weight
    probs = torch.softmax(scaled.to(weight.dtype), dim=-1, dtype=torch.float32).to(weight.dtype)
    result: torch.Tensor = (probs @ weight) * embed.embed_scale.to(weight.dtype)
    return result
