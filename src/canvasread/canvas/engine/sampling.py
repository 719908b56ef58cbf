"""One denoising step of transformers' DiffusionGemma generation loop, shared by pinned reads and thoughts.

transformers' `generate` takes each step as: the logits divided by the
linear schedule's temperature `t_min + (t_max - t_min) * remaining / steps`
(`remaining` counts down from `steps`: the loop's `cur_step`); a token
sampled at every position from that softmax; the entropy-bound sampler's
acceptance (positions sorted by entropy, the longest lowest-entropy run
whose entropy sum less its largest term stays within the bound keeps its
samples); every other position renoised with a uniform token id (the sample
drawn first, the renoise second, from one generator); the scaled logits
kept as the next pass's self-conditioning. `draw` is that step, so a
multi-step read (`steps.py`) and a thought (`generation.py`) take exactly
the step `generate` takes, draw for draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Schedule:
    """The checkpoint's generation config as `generate` resolves it: steps, temperatures, sampler, stopping.

    `stability` and `confidence` are the adaptive stop (None: every step runs); `steps` is how many denoising
    steps a block of a generation takes (a pinned read takes its own `steps`).
    """

    t_min: float
    t_max: float
    entropy_bound: float
    steps: int
    stability: int | None = None
    confidence: float | None = None

    @classmethod
    def of(cls, model: Any) -> Schedule:
        # generate()'s own resolution: the checkpoint's generation_config.json over transformers' defaults,
        # so a read or a thought never disagrees with generate() about the schedule.
        config, _ = model._prepare_generation_config(None)
        stops = config.stability_threshold is not None and config.confidence_threshold is not None
        return cls(
            float(config.t_min),
            float(config.t_max),
            float(config.sampler_config.entropy_bound),
            int(config.max_denoising_steps),
            int(config.stability_threshold) if stops else None,
            float(config.confidence_threshold) if stops else None,
        )

    def temperature(self, remaining: int, steps: int) -> float:
        return self.t_min + (self.t_max - self.t_min) * (remaining / steps)


@dataclass(frozen=True)
class Draw:
    """What one step left: the next canvas (samples kept, the rest renoised), the argmax canvas, the scaled
    logits' per-position entropy and the soft embeddings the next pass is self-conditioned on."""

    canvas: torch.Tensor
    argmax: torch.Tensor
    entropy: torch.Tensor
    signal: torch.Tensor


def draw(
    logits: torch.Tensor, temperature: float, entropy_bound: float, generator: torch.Generator, embed: Any
) -> Draw:
    """One step over a canvas's logits ([canvas, vocab], fp32, soft-capped), drawing from `generator`."""
    scaled = logits / temperature
    probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
    sampled = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    entropy = torch.distributions.Categorical(logits=scaled).entropy()  # type: ignore[no-untyped-call]
    ordered, order = torch.sort(entropy)
    kept = torch.cumsum(ordered, dim=-1) - ordered <= entropy_bound
    accepted = torch.zeros_like(kept).scatter(0, order, kept)
    noise = torch.randint(0, logits.shape[-1], (1, logits.shape[0]), generator=generator, device=logits.device).squeeze(
        0
    )
    canvas = torch.where(accepted, sampled, noise)
    return Draw(canvas, torch.argmax(scaled, dim=-1), entropy, soft_embeddings(scaled, embed))


def soft_embeddings(scaled: torch.Tensor, embed: Any) -> torch.Tensor:
    """The self-conditioning input transformers' decoder builds from the previous step's scaled logits."""
    weight = embed.weight
    probs = torch.softmax(scaled.to(weight.dtype), dim=-1, dtype=torch.float32).to(weight.dtype)
    result: torch.Tensor = (probs @ weight) * embed.embed_scale.to(weight.dtype)
    return result


def noise_canvas(length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """A fresh canvas of uniform token ids, as the sampler's `initialize_canvas` draws it."""
    device = generator.device
    return torch.randint(0, vocab, (1, length), generator=generator, device=device).squeeze(0)
