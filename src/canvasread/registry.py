"""From a `--model` string to a backend: the embedded sparrow models or a DiffusionGemma checkpoint."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from canvasread.backends.base import AnyBackend
from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL, SparrowBackend, is_sparrow_model
from canvasread.decide import Decider, DeciderConfig
from canvasread.errors import MissingExtra


@dataclass(frozen=True)
class EngineOptions:
    """How an in-process DiffusionGemma checkpoint is run; None picks the best the machine has."""

    device: str | None = None
    dtype: str | None = None


def backend_for(spec: str, engine: EngineOptions = EngineOptions()) -> AnyBackend:
    """A sparrow model name (`sparrow-…`, or a `.sparrow` file), else a DiffusionGemma path or hub id."""
    if is_sparrow_model(spec):
        return SparrowBackend(spec)
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"serving {spec!r} needs {' and '.join(missing)}: pip install 'canvasread[diffusion]'")
    from canvasread.backends.canvas import canvas_backend_for_checkpoint

    return canvas_backend_for_checkpoint(spec, device=engine.device, dtype=engine.dtype)


def open_decider(
    models: tuple[str, ...] = (DEFAULT_SPARROW_MODEL,),
    config: DeciderConfig = DeciderConfig(),
    engine: EngineOptions = EngineOptions(),
    *,
    load: bool = True,
) -> Decider:
    """Build a `Decider` for the given models (the first is the default) and, by default, load them now."""
    decider = Decider([backend_for(spec, engine) for spec in models], config)
    if load:
        decider.load()
        if not decider.ready:
            raise RuntimeError("; ".join(decider.not_ready_reasons()))
    return decider
