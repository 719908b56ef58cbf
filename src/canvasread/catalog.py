"""Which backends serve a `--model` string (embedded sparrow models, DiffusionGemma checkpoints), and the wings.

`open_decider` is the library's entry point: model strings and wings in, a
loaded `Decider` out. A *wing* is another way to execute reads (the vLLM
wing: `VllmSettings`), given as its settings, which build its own backends,
as an httpx `Client` takes its transport. The heavy wings (torch,
transformers) are imported only when a model needs them, so the base install
serves the embedded default without them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from canvasread.backends.base import AnyBackend
from canvasread.backends.sparrow import DEFAULT_SPARROW_MODEL, SparrowBackend, SparrowLimits, is_sparrow_model
from canvasread.canvas.backend import ReadSettings
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.tokenizer import locate
from canvasread.decide import DEFAULT_ALIASES, Decider, DeciderSettings
from canvasread.errors import ModelNotFound, NotReady
from canvasread.extras import require

# What a DiffusionGemma checkpoint's config.json says it is, and the files that hold weights.
CHECKPOINT_TYPE = "diffusion_gemma"
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")


class Wing(Protocol):
    """An execution wing's settings: where its models run and how to reach them, and the backends they build.

    Contract for `backends(reading)`: cheap and contacts nothing but the model hub, once, for a tokenizer it has
    not cached (each backend loads, connects and waits in its own `load()`, behind the open port); raises
    `MissingExtra` when the wing needs a package that is not installed, `ModelNotFound` for a tokenizer that
    cannot be found, and `ValueError` for settings that can never work. `reading` is the server's read settings, which
    every canvas wing reads with (a wing that reads no canvas ignores them).
    """

    def backends(self, reading: ReadSettings) -> list[AnyBackend]: ...


def _sparrow(spec: str, limits: SparrowLimits) -> SparrowBackend:
    """The backend, once its name resolves to a model file: an unknown name can never load."""
    backend = SparrowBackend(spec, limits)
    try:
        backend.fingerprint  # noqa: B018 (resolves the name to its file and hashes it, ~2 MB)
    except FileNotFoundError as error:
        raise ModelNotFound(str(error)) from None
    return backend


def _check_local_checkpoint(spec: str, weights: bool) -> None:
    """A spec written as a path (or naming something that exists) must be a checkpoint folder; else a hub id.

    What a folder must hold to load at all is checked here, before the port binds: a DiffusionGemma config,
    a tokenizer and (unless the weights are drawn at random) weights.
    """
    folder = Path(spec)
    if not (spec.startswith(("/", "./", "../")) or folder.exists()):
        return
    if not folder.is_dir():
        raise ModelNotFound(f"no checkpoint folder {spec!r}: give a DiffusionGemma folder, a hub id or a sparrow name")
    if not (folder / "config.json").is_file():
        raise ModelNotFound(f"{spec} has no config.json: it is not a DiffusionGemma checkpoint folder")
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise ModelNotFound(f"{spec}/config.json is not a JSON object: the checkpoint cannot load") from None
    if model_type != CHECKPOINT_TYPE:
        raise ModelNotFound(f"{spec} holds a {model_type!r} model, not DiffusionGemma (model_type {CHECKPOINT_TYPE!r})")
    locate(spec)
    if weights and not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ModelNotFound(f"{spec} has no weights ({', '.join(WEIGHT_FILES)}); --random-weights draws them")


def backends_for(
    spec: str,
    engine: EngineSettings = EngineSettings(),
    reading: ReadSettings = ReadSettings(),
    sparrow: SparrowLimits = SparrowLimits(),
) -> list[AnyBackend]:
    """A sparrow model name (`sparrow-…`, or a `.sparrow` file), else a DiffusionGemma path or hub id.

    What can be known without loading is checked here, so `serve` refuses a model
    that can never load before it binds: an unknown sparrow name, a missing
    folder, a missing or too old extra, a hub id that is neither cached nor on
    the hub (asked once, see `canvas.tokenizer.locate`). A slow but valid load happens behind the open port.
    `reading` (the read layout, re-read rule) applies to the canvas backends; sparrow models read no canvases,
    and `sparrow` (what one request may make them read) applies to them alone.
    The default model's aliases (`default`, `jev-latest`...) name the embedded default.
    """
    spec = DEFAULT_SPARROW_MODEL if spec in DEFAULT_ALIASES else spec
    if is_sparrow_model(spec):
        return [_sparrow(spec, sparrow)]
    _check_local_checkpoint(spec, weights=engine.random_init_std is None)
    require(("torch", "transformers"), f"serving {spec!r}", "diffusion")
    locate(spec, "config.json", "checkpoint")  # a hub id that is neither cached nor on the hub: one line, at once
    from canvasread.canvas.engine.factory import checkpoint_backends

    return checkpoint_backends(spec, engine, reading)


def open_decider(
    models: Sequence[str] = (DEFAULT_SPARROW_MODEL,),
    settings: DeciderSettings = DeciderSettings(),
    *,
    wings: Sequence[Wing] = (),
    engine: EngineSettings = EngineSettings(),
    reading: ReadSettings = ReadSettings(),
    sparrow: SparrowLimits = SparrowLimits(),
    load: bool = True,
) -> Decider:
    """Build a `Decider` for the wings' models and then `models` (the first is the default) and, by default, load.

    `models` are sparrow names (read within `sparrow`'s limits) and DiffusionGemma checkpoints (read in process
    with `engine`); each wing builds its own backends (`VllmSettings(urls=..., tokenizer=...)`: DiffusionGemma
    served by vLLM).
    """
    served = [backend for wing in wings for backend in wing.backends(reading)]
    backends = [backend for spec in models for backend in backends_for(spec, engine, reading, sparrow)]
    decider = Decider([*served, *backends], settings)
    if load:
        decider.load()
        if not decider.ready:
            raise NotReady("; ".join(decider.not_ready_reasons()))
    return decider
