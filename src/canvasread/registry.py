"""From a `--model` string to a backend (embedded sparrow models, DiffusionGemma checkpoints) or to vLLM upstreams."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from canvasread.backends.base import AnyBackend
from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL, SparrowBackend, is_sparrow_model
from canvasread.decide import Decider, DeciderConfig
from canvasread.errors import MissingExtra

if TYPE_CHECKING:
    from canvasread.upstream_backend import UpstreamSettings


@dataclass(frozen=True)
class EngineOptions:
    """How DiffusionGemma checkpoints are run; None picks the best the machine has.

    `random_init_std` builds the model from the folder's config with random
    weights (speed tests without the checkpoint); `naive_baseline` also serves
    `<model>-naive`, plain transformers forwards on the same model instance.
    """

    device: str | None = None
    dtype: str | None = None
    experts: str | None = None
    random_init_std: float | None = None
    naive_baseline: bool = False
    gpus: int = 1

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus must be at least 1")
        if self.gpus > 1 and self.device is not None:
            raise ValueError("--gpus places one replica on each of cuda:0..N-1; leave --device out")


def backends_for(spec: str, engine: EngineOptions = EngineOptions()) -> list[AnyBackend]:
    """A sparrow model name (`sparrow-…`, or a `.sparrow` file), else a DiffusionGemma path or hub id."""
    if is_sparrow_model(spec):
        return [SparrowBackend(spec)]
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"serving {spec!r} needs {' and '.join(missing)}: pip install 'canvasread[diffusion]'")
    from canvasread.backends.canvas import EngineSettings, canvas_backend_for_checkpoint

    settings = EngineSettings(
        device=engine.device, dtype=engine.dtype, experts=engine.experts, random_init_std=engine.random_init_std
    )
    backends: list[AnyBackend] = [canvas_backend_for_checkpoint(spec, settings)]
    if engine.gpus > 1:
        from canvasread.backends.replicas import ReplicaSet

        backends = [
            ReplicaSet(
                [
                    canvas_backend_for_checkpoint(spec, replace(settings, device=f"cuda:{index}"))
                    for index in range(engine.gpus)
                ]
            )
        ]
    if engine.naive_baseline:
        backends.append(canvas_backend_for_checkpoint(spec, replace(settings, naive=True)))
    return backends


def upstream_backends(settings: UpstreamSettings) -> list[AnyBackend]:
    """DiffusionGemma served by vLLM, read through its OpenAI-compatible API (needs only the tokenizer here)."""
    if importlib.util.find_spec("transformers") is None:
        raise MissingExtra("reading through vLLM needs the model's tokenizer: pip install 'canvasread[upstream]'")
    from canvasread.upstream_backend import canvas_backend_for_upstream

    return [canvas_backend_for_upstream(settings)]


def open_decider(
    models: tuple[str, ...] = (DEFAULT_SPARROW_MODEL,),
    config: DeciderConfig = DeciderConfig(),
    engine: EngineOptions = EngineOptions(),
    *,
    load: bool = True,
    upstream: UpstreamSettings | None = None,
) -> Decider:
    """Build a `Decider` for the given models (the first is the default) and, by default, load them now.

    With `upstream`, the vLLM-served model comes first (the default), before `models`.
    """
    served = upstream_backends(upstream) if upstream is not None else []
    decider = Decider([*served, *(backend for spec in models for backend in backends_for(spec, engine))], config)
    if load:
        decider.load()
        if not decider.ready:
            raise RuntimeError("; ".join(decider.not_ready_reasons()))
    return decider
