"""Random-weight builds: the model's dtype is set for the building thread only."""

from __future__ import annotations

import threading

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from canvasread.canvas.engine.weights import build_random
from canvasread.tools.checkpoints import tiny_config


def test_a_bf16_build_matches_a_default_dtype_build_and_leaves_other_threads_alone() -> None:
    config = tiny_config(vocab_size=512)
    inside = threading.Event()
    release = threading.Event()
    seen: list[torch.dtype] = []

    class Probe(DiffusionGemmaForBlockDiffusion):  # type: ignore[misc]
        def __init__(self, config: object) -> None:
            super().__init__(config)
            inside.set()
            release.wait(timeout=60)

    def other_thread() -> None:
        inside.wait(timeout=60)
        seen.append(torch.zeros(1).dtype)  # created while the build is in progress
        release.set()

    watcher = threading.Thread(target=other_thread)
    watcher.start()
    built = build_random(Probe, config, device=torch.device("cpu"), dtype=torch.bfloat16, std=0.02)
    watcher.join()
    assert seen == [torch.float32]
    assert torch.get_default_dtype() == torch.float32

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        reference = DiffusionGemmaForBlockDiffusion(config)
    finally:
        torch.set_default_dtype(previous)
    expected = {name: t.dtype for name, t in [*reference.named_parameters(), *reference.named_buffers()]}
    got = {name: t.dtype for name, t in [*built.named_parameters(), *built.named_buffers()]}
    assert got == expected
    assert torch.bfloat16 in got.values() and torch.float32 in got.values()  # rotary frequencies stay fp32


def test_weights_are_drawn_and_norms_are_identity() -> None:
    model = build_random(
        DiffusionGemmaForBlockDiffusion,
        tiny_config(vocab_size=512),
        device=torch.device("cpu"),
        dtype=torch.float32,
        std=0.5,
    )
    layer = model.model.encoder.language_model.layers[0]
    assert abs(float(layer.self_attn.q_proj.weight.detach().std()) - 0.5) < 0.05
    assert torch.all(layer.input_layernorm.weight == 1.0)
