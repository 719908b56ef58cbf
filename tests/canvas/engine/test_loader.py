"""Model loads are shared while something holds the model, and freed once nothing does; the device and dtype
they are asked for."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from canvasread.canvas.engine.loader import load_checkpoint, present_device, resolve_device, resolve_dtype
from canvasread.canvas.engine.settings import DTYPES


def test_loads_are_shared_while_held_and_freed_after(tiny_checkpoint: Path) -> None:
    first = load_checkpoint(str(tiny_checkpoint), random_init_std=0.02)
    second = load_checkpoint(str(tiny_checkpoint), random_init_std=0.02)
    assert second.model is first.model
    assert second.fingerprint == first.fingerprint
    other = load_checkpoint(str(tiny_checkpoint), random_init_std=0.03)
    assert other.model is not first.model

    gone = weakref.ref(first.model)
    del first, second
    gc.collect()
    assert gone() is None, "a model nobody holds is freed"
    again = load_checkpoint(str(tiny_checkpoint), random_init_std=0.02)
    assert again.model is not None and again.fingerprint.endswith("-random0.02")


def test_a_dtype_name_resolves_to_its_torch_dtype_from_the_settings_list() -> None:
    cpu = torch.device("cpu")
    assert {name: resolve_dtype(name, cpu) for name in ("fp32", "bf16", "float16")} == {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
    }
    assert all(isinstance(resolve_dtype(name, cpu), torch.dtype) for name in DTYPES)
    with pytest.raises(ValueError, match="unknown --dtype 'int7'"):
        resolve_dtype("int7", cpu)


def test_a_device_this_machine_has_is_taken_as_named() -> None:
    assert present_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu:0") == torch.device("cpu:0")


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (f"cuda:{torch.cuda.device_count()}", "no device 'cuda:"),  # one past the GPUs here (cuda:0 on a CPU machine)
        ("nope", "unknown device 'nope'"),
        ("cuda:x", "unknown device 'cuda:x'"),
    ],
)
def test_a_device_this_machine_lacks_or_torch_cannot_read_is_refused(device: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        present_device(device)
