"""`Generation`'s adaptive stop against transformers' own `StableAndConfidentStoppingCriteria`, step by step.

Random tiny checkpoints never grow confident enough to stop early, so the stop is driven here by hand: the
same argmax canvases and logits go to both, and both must stop at the same steps.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import StableAndConfidentStoppingCriteria

from canvasread.canvas.engine.generation import Generation
from canvasread.canvas.engine.sampling import Schedule
from canvasread.canvas.thinker import ThoughtRequest


def schedule(stability: int | None, confidence: float | None) -> Schedule:
    return Schedule(0.4, 0.8, 0.1, 6, stability, confidence)


@pytest.mark.parametrize(("stability", "confidence"), [(0, 1.0), (1, 1.0), (2, 9.0), (3, 9.0), (1, 0.8)])
def test_the_adaptive_stop_stops_where_transformers_does(stability: int, confidence: float) -> None:
    generator = torch.Generator().manual_seed(stability * 10 + int(confidence * 10))
    generation = Generation(
        ThoughtRequest((1, 2), 8, (), 0), schedule(stability, confidence), canvas_length=4, vocab=5,
        device=torch.device("cpu"),
    )  # fmt: skip
    theirs = StableAndConfidentStoppingCriteria(stability, confidence)
    same, other = torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4])
    stopped = []
    for step, argmax in enumerate([same] * 4 + [other] * 4 + [same] * 2):
        logits = torch.randn(4, 5, generator=generator) * (3.0 if step % 2 else 0.3)  # confident every other step
        entropy = torch.distributions.Categorical(logits=logits).entropy()
        expected = bool(theirs(argmax[None], logits[None])[0])
        assert generation.stops(argmax, entropy) == expected, f"step {step}"
        stopped.append(expected)
    assert any(stopped) and not all(stopped), "each case stops at some steps and not at others"


def test_without_stop_settings_every_step_runs() -> None:
    generation = Generation(
        ThoughtRequest((1,), 8, (), 0), schedule(None, None), canvas_length=4, vocab=5, device=torch.device("cpu")
    )
    assert not any(generation.stops(torch.tensor([1, 1, 1, 1]), torch.zeros(4)) for _ in range(5))
