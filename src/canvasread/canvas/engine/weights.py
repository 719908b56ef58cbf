"""Random-weight builds (`serve --random-weights`): the full model shape from a config, no checkpoint needed.

A model is built in a floating-point dtype by a function mode that is local
to the building thread, not by `torch.set_default_dtype` (process-wide: a
replica loading in one thread would change the dtype of tensors another
thread creates meanwhile).
"""

from __future__ import annotations

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


def build_random(model_class: Any, config: Any, *, device: torch.device, dtype: torch.dtype, std: float) -> Any:
    """`model_class(config)` built on `device` in `dtype` with every weight drawn by `initialise_weights`."""
    with torch.device(device), _FloatDtype(dtype):
        model = model_class(config)
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
