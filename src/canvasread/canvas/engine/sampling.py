"""One denoising step of transformers' DiffusionGemma generation loop, shared by pinned reads and thoughts.

transformers' `generate` takes each step as: the logits divided by the
linear schedule's temperature `t_min + (t_max - t_min) * remaining / steps`
(`remaining` counts down from `steps`: the loop's `cur_step`); a token
sampled at every position from that softmax; the entropy-bound sampler's
acceptance (positions sorted by entropy, the longest lowest-entropy run
whose entropy sum less its largest term stays within the bound keeps its
samples); every other position renoised with a uniform token id (the sample
drawn first, the renoise second, from one generator); the scaled logits
kept as the next pass's self-conditioning. `scale` is the step's
arithmetic over the full vocabulary (the head, soft-cap, temperature,
distribution, entropy, argmax), which the engine compiles into a few fused
passes on a GPU; `draw` takes the step's random draws from it. So a
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
class Scaled:
    """A canvas's logits at a step's temperature, as the step takes them: the sampling distribution (fp32), each
    position's entropy, the argmax canvas, and the self-conditioning mixture (that distribution in the
    embedding's dtype)."""

    probs: torch.Tensor
    entropy: torch.Tensor
    argmax: torch.Tensor
    mixture: torch.Tensor


def softcapped(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    """The LM head's output in fp32 and soft-capped, as the model's forward makes its logits."""
    logits = logits.float()
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def scale(
    normed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: torch.Tensor, softcap: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`Scaled`'s tensors from a canvas's normed final hidden states ([canvas, hidden]), the LM head's weight and
    bias, and a 0-d temperature: every full-vocabulary tensor of the step's arithmetic, written so a compiler can
    fuse them into a few passes over the logits (eagerly they are ATen's softmax and log-softmax, the very
    distribution `generate` samples)."""
    scaled = softcapped(torch.nn.functional.linear(normed, weight, bias), softcap) / temperature
    probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
    entropy = -(probs * torch.log_softmax(scaled, dim=-1)).sum(dim=-1)
    if weight.dtype == torch.float32:
        mixture = probs
    else:
        mixture = torch.softmax(scaled.to(weight.dtype), dim=-1, dtype=torch.float32).to(weight.dtype)
    return probs, entropy, torch.argmax(scaled, dim=-1), mixture


@dataclass(frozen=True)
class Draw:
    """What one step left: the next canvas (samples kept, the rest renoised), the argmax canvas, the scaled
    logits' per-position entropy and the mixture the next pass's self-conditioning is made of
    (`soft_embeddings`)."""

    canvas: torch.Tensor
    argmax: torch.Tensor
    entropy: torch.Tensor
    mixture: torch.Tensor


def draw(scaled: Scaled, entropy_bound: float, generator: torch.Generator) -> Draw:
    """One step over a canvas's scaled logits, drawing from `generator`."""
    probs = scaled.probs
    sampled = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    ordered, order = torch.sort(scaled.entropy)
    kept = torch.cumsum(ordered, dim=-1) - ordered <= entropy_bound
    accepted = torch.zeros_like(kept).scatter(0, order, kept)
    noise = torch.randint(0, probs.shape[-1], (1, probs.shape[0]), generator=generator, device=probs.device)
    canvas = torch.where(accepted, sampled, noise.squeeze(0))
    return Draw(canvas, scaled.argmax, scaled.entropy, scaled.mixture)


def soft_embeddings(mixture: torch.Tensor, embed: Any) -> torch.Tensor:
    """The self-conditioning input transformers' decoder builds from the previous step's scaled logits (their
    distribution in the embedding's dtype: `Scaled.mixture`)."""
    weight = embed.weight
    result: torch.Tensor = (mixture @ weight) * embed.embed_scale.to(weight.dtype)
    return result


def noise_canvas(length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """A fresh canvas of uniform token ids, as the sampler's `initialize_canvas` draws it."""
    device = generator.device
    return torch.randint(0, vocab, (1, length), generator=generator, device=device).squeeze(0)
