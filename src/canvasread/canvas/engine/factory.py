"""Builds the canvas backend for an in-process checkpoint; nothing heavy is imported until `load()`."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from canvasread.backends.base import AnyBackend
from canvasread.backends.replicas import ReplicaSet
from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.planning import StoreCapacity
from canvasread.canvas.prompt import ImageTokens
from canvasread.canvas.reader import Reader
from canvasread.canvas.thinker import Thinker
from canvasread.types import MAX_STEPS, Capabilities, ModelCard

if TYPE_CHECKING:
    from canvasread.canvas.engine.loader import LoadedModel

# What sizes the engine's KV store, named in the 413 of a request whose prompts it cannot hold.
CAPACITY_LIMIT = (
    "--kv-cache-gib (EngineSettings.cache_bytes): 40% of the GPU memory free after start-up, 2 GiB on a CPU"
)


def canvas_backend_for_checkpoint(
    spec: str,
    settings: EngineSettings = EngineSettings(),
    reading: ReadSettings = ReadSettings(),
    *,
    naive: bool = False,
) -> CanvasBackend:
    """An in-process DiffusionGemma backend; nothing heavy happens until `load()`.

    With `naive` it reads through plain transformers forwards instead
    of the fused engine (the benchmark baseline), under the name `<model>-naive`.
    """
    name = spec.rstrip("/").rsplit("/", 1)[-1] + ("-naive" if naive else "")
    how = "plain transformers forwards (naive baseline)" if naive else "the fused in-process engine"
    card = ModelCard(
        name=name,
        description=f"DiffusionGemma checkpoint {spec} read through {how}: label slots read as distributions "
        "from one read-only denoising step (or `steps`, pinned).",
        release_date=time.strftime("%Y-%m-%d"),
        capabilities=Capabilities(
            images=not naive and _may_see_images(spec),
            spans=True,
            max_options=255,
            max_levels=10,
            think=True,
            max_steps=1 if naive else MAX_STEPS,  # the naive baseline reads one plain forward
        ),
    )

    return CanvasBackend(card, functools.partial(load_runtime, spec, settings, naive=naive), reading)


def load_runtime(spec: str, settings: EngineSettings, *, naive: bool) -> CanvasRuntime:
    """Load the checkpoint and build its runtime: the fused engine, or plain forwards for the naive baseline."""
    from canvasread.canvas.engine.loader import load_checkpoint
    from canvasread.canvas.tokenizer import HFTokenizer

    loaded = load_checkpoint(
        spec,
        device=settings.device,
        dtype=settings.dtype,
        experts=settings.experts,
        random_init_std=settings.random_init_std,
    )
    config = loaded.model.config
    tokenizer = HFTokenizer(loaded.tokenizer)
    engine = _naive(loaded, tokenizer.pad_id) if naive else _fused(loaded, settings)
    return CanvasRuntime(
        reader=engine.reader,
        tokenizer=tokenizer,
        canvas_length=int(config.canvas_length),
        max_positions=int(config.text_config.max_position_embeddings),
        # FP8 experts read different numbers: a calibration fit on bf16 reads does not carry over.
        fingerprint=loaded.fingerprint + ("-fp8-experts" if settings.fp8_experts and not naive else ""),
        images=engine.images,
        thinker=engine.thinker,
        capacity=engine.capacity,
        batches=engine.batches,
    )


class _Engine(NamedTuple):
    """What reads and thinks for a runtime, and what the runtime says of it."""

    reader: Reader
    thinker: Thinker
    images: ImageTokens | None = None
    capacity: StoreCapacity | None = None
    batches: int = 1


def _naive(loaded: LoadedModel, pad_id: int) -> _Engine:
    """Plain transformers forwards and `generate`, one request at a time (the benchmark baseline)."""
    from canvasread.canvas.engine.naive import NaiveReader
    from canvasread.canvas.engine.thinker import GenerateThinker

    thinker = GenerateThinker(loaded.model, pad_id=pad_id, image_processor=loaded.image_processor)
    return _Engine(NaiveReader(loaded.model), thinker)


def _fused(loaded: LoadedModel, settings: EngineSettings) -> _Engine:
    """The fused engine, warmed before it answers: its reads and thoughts share one loop's passes, fed by
    `batches_in_flight` batches at once."""
    from canvasread.canvas.engine.reader import EngineThinker, InProcessReader
    from canvasread.canvas.engine.runner import FusedRunner

    model = loaded.model
    on_cuda = next(model.parameters()).device.type == "cuda"
    runner = FusedRunner(
        model,
        cuda_graphs=settings.cuda_graphs,
        image_processor=loaded.image_processor,
        compile="inductor" if settings.compile and on_cuda else None,
        fp8_experts=settings.fp8_experts,
        buckets=settings.buckets,
    )
    runner.warm_up()  # every bucket compiled and captured before /ready; the store sized after it
    reader = InProcessReader(
        runner, cache_bytes=settings.cache_bytes, max_rows=settings.max_rows, pass_tokens=settings.pass_tokens
    )
    images = None
    if loaded.image_processor is not None:
        ids = (int(model.config.boi_token_id), int(model.config.image_token_id), int(model.config.eoi_token_id))
        images = ImageTokens(*ids, runner.image_token_count)
    capacity = StoreCapacity(reader.store.pages, reader.store.page, CAPACITY_LIMIT)
    return _Engine(reader, EngineThinker(reader), images, capacity, settings.batches_in_flight)


def checkpoint_backends(
    spec: str, settings: EngineSettings = EngineSettings(), reading: ReadSettings = ReadSettings()
) -> list[AnyBackend]:
    """The backends that serve one checkpoint: one replica per GPU, plus `<model>-naive` when asked for."""
    backends: list[AnyBackend]
    if settings.gpus > 1:
        replicas = [
            canvas_backend_for_checkpoint(spec, replace(settings, device=f"cuda:{index}"), reading)
            for index in range(settings.gpus)
        ]
        backends = [ReplicaSet(replicas)]
    else:
        backends = [canvas_backend_for_checkpoint(spec, settings, reading)]
    if settings.naive_baseline:
        backends.append(canvas_backend_for_checkpoint(spec, settings, reading, naive=True))
    return backends


def _may_see_images(spec: str) -> bool:
    """A local checkpoint sees images when it ships an image processor config; a hub id is assumed to."""
    folder = Path(spec)
    return not folder.is_dir() or (folder / "preprocessor_config.json").exists()
