"""Which backends serve a `--model` string: embedded sparrow models, DiffusionGemma checkpoints, vLLM upstreams.

`open_decider` is the library's entry point: model strings in, a loaded
`Decider` out. The heavy wings (torch, transformers) are imported only when a
model needs them, so the base install serves the embedded default without them.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from canvasread.backends.base import AnyBackend
from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL, SparrowBackend, is_sparrow_model
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.decide import Decider, DeciderSettings
from canvasread.errors import MissingExtra

if TYPE_CHECKING:
    from canvasread.canvas.vllm.settings import UpstreamSettings


def backends_for(spec: str, engine: EngineSettings = EngineSettings()) -> list[AnyBackend]:
    """A sparrow model name (`sparrow-…`, or a `.sparrow` file), else a DiffusionGemma path or hub id."""
    if is_sparrow_model(spec):
        return [SparrowBackend(spec)]
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"serving {spec!r} needs {' and '.join(missing)}: pip install 'canvasread[diffusion]'")
    from canvasread.canvas.engine.factory import checkpoint_backends

    return checkpoint_backends(spec, engine)


def upstream_backends(settings: UpstreamSettings) -> list[AnyBackend]:
    """DiffusionGemma served by vLLM, read through its OpenAI-compatible API (needs only the tokenizer here)."""
    if importlib.util.find_spec("transformers") is None:
        raise MissingExtra("reading through vLLM needs the model's tokenizer: pip install 'canvasread[upstream]'")
    from canvasread.canvas.vllm.factory import canvas_backend_for_upstream

    return [canvas_backend_for_upstream(settings)]


def open_decider(
    models: tuple[str, ...] = (DEFAULT_SPARROW_MODEL,),
    settings: DeciderSettings = DeciderSettings(),
    engine: EngineSettings = EngineSettings(),
    *,
    load: bool = True,
    upstream: UpstreamSettings | None = None,
) -> Decider:
    """Build a `Decider` for the given models (the first is the default) and, by default, load them now.

    With `upstream`, the vLLM-served model comes first (the default), before `models`.
    """
    served = upstream_backends(upstream) if upstream is not None else []
    decider = Decider([*served, *(backend for spec in models for backend in backends_for(spec, engine))], settings)
    if load:
        decider.load()
        if not decider.ready:
            raise RuntimeError("; ".join(decider.not_ready_reasons()))
    return decider
