"""Random-weight builds (`serve --random-weights`): the full model shape from a config, no checkpoint needed.

A model is built in a floating-point dtype by a function mode that is local
to the building thread, not by `torch.set_default_dtype` (process-wide: a
replica loading in one thread would change the dtype of tensors another
thread creates meanwhile).

Parameters are built on the meta device and allocated only after
transformers has tied them: DiffusionGemma's encoder text model and decoder
share every weight, but are tied only in `post_init`, after both were built.
Built directly on the device, the 26B-A4B model would hold 51.4B parameters
(103 GB in bf16) at once where the tied model has 25.4B (51 GB), so it would
not fit an 80 GB GPU. Buffers (rotary frequencies, embedding scales) are
still computed on the device. The hook that swaps parameters for meta ones
is process-wide, so it acts only in the thread doing the build (a flag local
to that thread) and is removed when the build ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Factories whose result takes the default floating dtype when none is given.
_FLOAT_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.empty_strided})
# Factories whose result dtype follows their arguments (a float argument gives the default floating dtype).
_INFERRING_FACTORIES = frozenset({torch.tensor, torch.full, torch.arange, torch.linspace})


class _FloatDtype(TorchFunctionMode):
    """Within this thread, tensors created without a dtype get `dtype` where they would get float32."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") is None and func in _FLOAT_FACTORIES:
            kwargs["dtype"] = self.dtype
        result = func(*args, **kwargs)
        if kwargs.get("dtype") is None and func in _INFERRING_FACTORIES and result.dtype == torch.float32:
            result = result.to(self.dtype)
        return result


# Set in the thread that is building a model: the parameter hook acts there only.
_building = threading.local()


def _building_here() -> bool:
    """Whether this thread is inside `_meta_parameters` (other threads' modules keep their parameters)."""
    return bool(getattr(_building, "active", False))


def _to_meta(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter) -> torch.nn.Parameter | None:
    """A meta stand-in for a parameter being registered in the building thread; None leaves it as it is.

    An already-meta parameter is left alone: tying re-registers the tied-to parameter, which must stay that object.
    """
    if not _building_here() or parameter.is_meta:
        return None
    return torch.nn.Parameter(torch.empty_like(parameter, device="meta"), requires_grad=parameter.requires_grad)


@contextlib.contextmanager
def _meta_parameters() -> Iterator[None]:
    """Within this thread, every parameter registered is replaced by a meta one; the hook goes when the block ends."""
    previous = _building_here()
    _building.active = True
    # torch types the hook as returning None, though its documentation and code take a replacement parameter.
    handle = torch.nn.modules.module.register_module_parameter_registration_hook(_to_meta)  # type: ignore[arg-type]
    try:
        yield
    finally:
        handle.remove()
        _building.active = previous


def _materialise(model: torch.nn.Module, device: torch.device) -> None:
    """Give each meta parameter uninitialised memory on `device`, once per Parameter, so tied weights stay tied."""
    allocated: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False, remove_duplicate=False)):
            if not parameter.is_meta:
                continue
            if id(parameter) not in allocated:
                real = torch.empty_like(parameter, device=device)
                allocated[id(parameter)] = torch.nn.Parameter(real, requires_grad=parameter.requires_grad)
            setattr(module, name, allocated[id(parameter)])


def _check_materialised(model: torch.nn.Module) -> None:
    """Raise if a parameter or buffer was left on the meta device (it would fail only at the first forward)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise RuntimeError(f"random-weight build left {name!r} on the meta device")


def build_random(model_class: Any, config: Any, *, device: torch.device, dtype: torch.dtype, std: float) -> Any:
    """`model_class(config)` built on `device` in `dtype` with every weight drawn by `initialise_weights`.

    Parameters are allocated once, after transformers ties them (see the module docstring): the 26B-A4B model
    needs 51 GB instead of 103 GB, so it fits an 80 GB GPU.
    """
    with torch.device(device), _FloatDtype(dtype), _meta_parameters():
        model = model_class(config)
    _materialise(model, device)
    _check_materialised(model)
    initialise_weights(model, std=std)
    return model


def initialise_weights(model: Any, *, std: float = 0.02) -> None:
    """Draw every floating-point weight matrix from N(0, std) and set norms to their trained-like scale.

    Building a module on a GPU can leave memory uninitialised; timing such a
    model measures a different workload (the router sends every token to the
    same experts). Norm and router scales are set to 1, their identity value
    (Gemma 4's RMSNorm multiplies by the weight itself).
    """
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not parameter.is_floating_point():
                continue
            if parameter.dim() >= 2:
                parameter.normal_(0.0, std)
            elif "norm" in name or name.endswith("scale"):
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, std)
