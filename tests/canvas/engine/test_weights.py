"""Random-weight builds: the model's dtype is set for the building thread only."""

from __future__ import annotations

import threading

import pytest
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


def plain_and_random(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny model built plainly by transformers, and by `build_random` (parameters allocated after tying)."""
    config = tiny_config(vocab_size=512)
    plain = DiffusionGemmaForBlockDiffusion(config)
    built = build_random(DiffusionGemmaForBlockDiffusion, config, device=torch.device("cpu"), dtype=dtype, std=0.02)
    return plain, built


def test_nothing_is_left_on_the_meta_device() -> None:
    _, built = plain_and_random()
    left = [name for name, t in [*built.named_parameters(), *built.named_buffers()] if t.is_meta]
    assert left == []


def test_parameters_are_allocated_once_and_tied_as_in_a_plain_build() -> None:
    plain, built = plain_and_random()
    assert len({p.data_ptr() for p in built.parameters()}) == len(list(plain.parameters()))
    assert built.lm_head.weight.data_ptr() == built.model.decoder.embed_tokens.weight.data_ptr()
    encoder_layer = built.model.encoder.language_model.layers[1]
    decoder_layer = built.model.decoder.layers[1]
    assert encoder_layer.self_attn.q_proj.weight.data_ptr() == decoder_layer.self_attn.q_proj.weight.data_ptr()
    assert encoder_layer.experts.gate_up_proj.data_ptr() == decoder_layer.experts.gate_up_proj.data_ptr()


def test_buffers_are_computed_as_in_a_plain_build() -> None:
    plain, built = plain_and_random()
    expected = dict(plain.named_buffers())
    got = dict(built.named_buffers())
    assert got.keys() == expected.keys()
    assert [name for name in expected if not torch.equal(got[name], expected[name])] == []


def test_the_meta_hook_acts_in_the_building_thread_only_and_goes_with_the_build() -> None:
    hooks = torch.nn.modules.module._global_parameter_registration_hooks
    before = len(hooks)
    inside = threading.Event()
    release = threading.Event()
    in_build: list[bool] = []
    built: list[torch.nn.Module] = []

    class Probe(DiffusionGemmaForBlockDiffusion):  # type: ignore[misc]
        def __init__(self, config: object) -> None:
            super().__init__(config)
            in_build.append(torch.nn.Linear(2, 2).weight.is_meta)
            inside.set()
            release.wait(timeout=60)

    def build() -> None:
        config = tiny_config(vocab_size=512)
        built.append(build_random(Probe, config, device=torch.device("cpu"), dtype=torch.float32, std=0.02))

    builder = threading.Thread(target=build)
    builder.start()
    try:
        assert inside.wait(timeout=60)
        elsewhere = torch.nn.Linear(2, 2)  # made in this thread while the other one builds
    finally:
        release.set()
        builder.join()
    assert in_build == [True]
    assert not elsewhere.weight.is_meta
    assert len(built) == 1
    assert len(hooks) == before


def test_a_failed_build_removes_the_hook() -> None:
    hooks = torch.nn.modules.module._global_parameter_registration_hooks
    before = len(hooks)

    class Failing(DiffusionGemmaForBlockDiffusion):  # type: ignore[misc]
        def __init__(self, config: object) -> None:
            super().__init__(config)
            raise ValueError("constructor failed")

    config = tiny_config(vocab_size=512)
    with pytest.raises(ValueError, match="constructor failed"):
        build_random(Failing, config, device=torch.device("cpu"), dtype=torch.float32, std=0.02)
    assert len(hooks) == before
    assert not torch.nn.Linear(2, 2).weight.is_meta
