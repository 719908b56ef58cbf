"""vLLM 0.33's denoising loop for one read-only diffusion request with pins, for the stand-in (`vllm_standin.py`).

Read in vLLM's `model_executor/models/diffusion_gemma.py` (`DiffusionSampler`, `_compiled_sample_step`,
`_denoise_temperature`, `DiffusionGemmaRequestStates`) and `diffusion_gemma_sampler.py`
(`sample_row_stats_reference`). Per step k = 0, 1, ... over the seeded canvas:

- the decoder reads the canvas, self-conditioned on the previous step's soft embeddings (zeros at the first
  step), which vLLM keeps as softmax(scaled logits) times the embedding matrix times the embedding scale and
  zeroes at pinned positions;
- the logits are scaled by `t_min + (t_max - t_min) * max(N - k, 1) / N`, where N is the *served*
  `max_denoising_steps` (48 unless the diffusion config or generation config says otherwise), not the
  request's cap;
- a Gumbel-max sample, the argmax and the entropy of every position; the entropy-bound rule keeps the
  lowest-entropy run, everything else is renoised with uniform ids, and pinned positions get the seed back;
- the request converges when its step count reaches `diffusion_max_steps` (capped at N), or earlier when the
  last `stability_threshold + 1` argmax canvases agree and the mean entropy is under `confidence_threshold`;
  a read-only request then emits this step's logprobs at temperature 1.

vLLM draws its random numbers unseeded; the stand-in draws them from a generator seeded by the seed canvas,
so tests can repeat a read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Denoiser:
    """The served model's diffusion settings, as vLLM reads them from the checkpoint's generation config."""

    t_min: float
    t_max: float
    entropy_bound: float
    max_denoising_steps: int
    stability_threshold: int
    confidence_threshold: float

    @classmethod
    def of(cls, model: Any) -> Denoiser:
        config, _ = model._prepare_generation_config(None)  # the generation config over transformers' defaults
        return cls(
            float(config.t_min),
            float(config.t_max),
            float(config.sampler_config.entropy_bound),
            int(config.max_denoising_steps),
            int(config.stability_threshold),
            float(config.confidence_threshold),
        )

    def temperature(self, step: int) -> float:
        remaining = max(self.max_denoising_steps - step, 1)
        return self.t_min + (self.t_max - self.t_min) * (remaining / self.max_denoising_steps)

    def read(
        self, forward: Any, embed: Any, seed: list[int], pinned: list[int], max_steps: int
    ) -> tuple[torch.Tensor, int]:
        """The emitted step's raw (temperature-1) logits [canvas, vocab] and how many steps ran.

        `forward(canvas, soft)` runs the decoder over `canvas` ([canvas] ids) with `soft` ([canvas, hidden] soft
        embeddings, or None at the first step) and returns its raw logits.
        """
        device = embed.weight.device
        template = torch.tensor(seed, device=device)
        pins = torch.zeros(len(seed), dtype=torch.bool, device=device)
        pins[pinned] = True
        generator = torch.Generator(device=device).manual_seed(_canvas_seed(seed))
        cap = max(1, min(max_steps, self.max_denoising_steps))
        canvas, soft, history = template, None, []
        for step in range(cap):
            raw = forward(canvas, soft)
            scaled = raw.float() / self.temperature(step)
            log_probs = scaled.log_softmax(dim=-1)
            probs = log_probs.exp()
            entropy = -torch.where(probs > 0, probs * log_probs, 0.0).sum(dim=-1)
            history = [*history, scaled.argmax(dim=-1)][-(self.stability_threshold + 1) :]
            stable = len(history) == self.stability_threshold + 1 and all(torch.equal(history[0], h) for h in history)
            if step + 1 >= cap or (stable and float(entropy.mean()) < self.confidence_threshold):
                return raw, step + 1
            uniform = torch.rand(scaled.shape, generator=generator, device=device).clamp(min=1e-20)
            sampled = (scaled - torch.log(-torch.log(uniform))).argmax(dim=-1)
            ordered, order = torch.sort(entropy)
            kept = torch.cumsum(ordered, dim=-1) - torch.cummax(ordered, dim=-1).values <= self.entropy_bound
            accepted = torch.zeros_like(kept).scatter(0, order, kept)
            noise = torch.randint(0, raw.shape[-1], (len(seed),), generator=generator, device=device)
            canvas = torch.where(pins, template, torch.where(accepted, sampled, noise))
            embedded = (probs.to(embed.weight.dtype) @ embed.weight) * embed.embed_scale.to(embed.weight.dtype)
            soft = embedded * (~pins)[:, None]
        raise AssertionError("unreachable: the last step always emits")


def _canvas_seed(seed: list[int]) -> int:
    return int.from_bytes(hashlib.sha256(repr(seed).encode()).digest()[:8], "big")
