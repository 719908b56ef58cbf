"""A denoising step's arithmetic (`sampling.scale`) against the formulas transformers' `generate` uses.

`generate` samples from `softmax(logits / temperature)` in fp32, takes its
entropies from `Categorical(logits=...)` and self-conditions on the softmax
in the embedding's dtype. `scale` writes all of them from one expression so
a compiler can fuse them; eagerly, the distribution must be bit for bit the
one `generate` samples from, and the rest equal to rounding.
"""

from __future__ import annotations

import pytest
import torch

from canvasread.canvas.engine.sampling import scale, softcapped

SOFTCAP = 30.0


def head(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Normed hidden states of a 12-token canvas and an LM head over 4,096 ids, in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    normed = torch.randn(12, 32, generator=generator).to(dtype)
    weight = (torch.randn(4096, 32, generator=generator) * 2.0).to(dtype)
    return normed, weight


def generate_logits(normed: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """The model's logits (fp32, soft-capped) divided by the temperature, as `generate` scales them."""
    raw = (normed @ weight.T).float()
    return torch.tanh(raw / SOFTCAP) * SOFTCAP / temperature


@pytest.mark.parametrize("temperature", [0.4, 0.6333, 1.0])
def test_the_distribution_is_generates_bit_for_bit(temperature: float) -> None:
    normed, weight = head(torch.float32)
    probs, entropy, argmax, mixture = scale(normed, weight, None, torch.tensor(temperature), SOFTCAP)
    logits = generate_logits(normed, weight, temperature)
    assert torch.equal(probs, torch.softmax(logits, dim=-1, dtype=torch.float32))
    assert torch.equal(argmax, torch.argmax(logits, dim=-1))
    reference = torch.distributions.Categorical(logits=logits).entropy()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(entropy, reference, rtol=1e-5, atol=1e-5)
    assert mixture is probs  # fp32: the embedding's dtype is the distribution's own


def test_a_bf16_model_self_conditions_on_the_softmax_in_bf16() -> None:
    normed, weight = head(torch.bfloat16, seed=1)
    probs, _, _, mixture = scale(normed, weight, None, torch.tensor(0.5), SOFTCAP)
    logits = generate_logits(normed, weight, 0.5)
    assert probs.dtype == torch.float32 and mixture.dtype == torch.bfloat16
    expected = torch.softmax(logits.to(torch.bfloat16), dim=-1, dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(mixture, expected)


def test_entropies_tell_confident_positions_from_unsure_ones() -> None:
    """One position's logits peaked, another's flat: their entropies are about 0 and about log(vocab)."""
    normed, weight = head(torch.float32, seed=2)
    normed[0] = weight[7]  # a hidden state that points at id 7 (its logit about 128, the next about 80)
    normed[1] = 0.0
    _, entropy, argmax, _ = scale(normed, weight, None, torch.tensor(1.0), 0.0)
    assert int(argmax[0]) == 7 and float(entropy[0]) < 0.05
    assert float(entropy[1]) == pytest.approx(torch.log(torch.tensor(4096.0)).item(), rel=1e-5)


def test_no_softcap_leaves_the_logits_as_the_head_wrote_them() -> None:
    logits = torch.tensor([[-80.0, 0.5, 80.0]], dtype=torch.bfloat16)
    assert torch.equal(softcapped(logits, 0.0), logits.float())
    assert float(softcapped(logits, SOFTCAP).abs().max()) < SOFTCAP
