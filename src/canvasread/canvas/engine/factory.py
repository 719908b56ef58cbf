"""Builds the canvas backend for an in-process checkpoint; nothing heavy is imported until `load()`."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

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
    from canvasread.canvas.engine.reader import InProcessReader

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
    """Load the checkpoint and build its runtime: the fused engine (in a process of its own where
    `EngineSettings.process` says so), or plain forwards for the naive baseline."""
    from canvasread.canvas.engine.loader import load_checkpoint, resolve_device

    apart = settings.process if settings.process is not None else resolve_device(settings.device).type == "cuda"
    if apart and not naive:
        return _engine_process(spec, settings)
    loaded = load_checkpoint(
        spec,
        device=settings.device,
        dtype=settings.dtype,
        experts=settings.experts,
        random_init_std=settings.random_init_std,
    )
    engine = _naive(loaded) if naive else _fused(loaded, settings)
    return _runtime(loaded.model.config, loaded.tokenizer, loaded.fingerprint, engine, settings, naive=naive)


class _Engine(NamedTuple):
    """What reads and thinks for a runtime, and what the runtime says of it."""

    reader: Reader
    thinker: Thinker
    images: ImageTokens | None = None
    capacity: StoreCapacity | None = None
    batches: int = 1
    health: Callable[[], str | None] | None = None
    close: Callable[[], None] | None = None


def _runtime(
    config: Any, tokenizer: Any, fingerprint: str, engine: _Engine, settings: EngineSettings, *, naive: bool
) -> CanvasRuntime:
    from canvasread.canvas.tokenizer import HFTokenizer

    return CanvasRuntime(
        reader=engine.reader,
        tokenizer=HFTokenizer(tokenizer),
        canvas_length=int(config.canvas_length),
        max_positions=int(config.text_config.max_position_embeddings),
        # FP8 experts read different numbers: a calibration fit on bf16 reads does not carry over.
        fingerprint=fingerprint + ("-fp8-experts" if settings.fp8_experts and not naive else ""),
        images=engine.images,
        thinker=engine.thinker,
        health=engine.health,
        close=engine.close,
        capacity=engine.capacity,
        batches=engine.batches,
    )


def _naive(loaded: LoadedModel) -> _Engine:
    """Plain transformers forwards and `generate`, one request at a time (the benchmark baseline)."""
    from canvasread.canvas.engine.naive import NaiveReader
    from canvasread.canvas.engine.thinker import GenerateThinker

    pad = loaded.tokenizer.pad_token_id
    thinker = GenerateThinker(loaded.model, pad_id=pad, image_processor=loaded.image_processor)
    return _Engine(NaiveReader(loaded.model), thinker)


def fused_reader(loaded: LoadedModel, settings: EngineSettings) -> InProcessReader:
    """The fused engine over a loaded model, warmed (every bucket compiled and captured) before it answers."""
    from canvasread.canvas.engine.reader import InProcessReader
    from canvasread.canvas.engine.runner import FusedRunner

    on_cuda = next(loaded.model.parameters()).device.type == "cuda"
    runner = FusedRunner(
        loaded.model,
        cuda_graphs=settings.cuda_graphs,
        image_processor=loaded.image_processor,
        compile="inductor" if settings.compile and on_cuda else None,
        fp8_experts=settings.fp8_experts,
        buckets=settings.buckets,
    )
    runner.warm_up()  # before /ready; the store is sized after it
    return InProcessReader(
        runner,
        cache_bytes=settings.cache_bytes,
        max_rows=settings.max_rows,
        pass_tokens=settings.pass_tokens,
        thought_share=settings.thought_share,
    )


def _fused(loaded: LoadedModel, settings: EngineSettings) -> _Engine:
    """The fused engine in this process: its reads and thoughts share one loop's passes, fed by
    `EngineSettings.batches` batches at once."""
    from canvasread.canvas.engine.reader import EngineThinker

    reader = fused_reader(loaded, settings)
    capacity = StoreCapacity(reader.store.pages, reader.store.page, CAPACITY_LIMIT)
    images = _image_tokens(loaded.model.config, loaded.image_processor)
    batches = settings.batches(on_gpu=reader.runner.stack.device.type == "cuda")
    return _Engine(reader, EngineThinker(reader), images, capacity, batches)


def _engine_process(spec: str, settings: EngineSettings) -> CanvasRuntime:
    """The fused engine in a process of its own (`worker.py`); this process keeps the tokenizer, the config and
    the image processor, to plan and refuse requests."""
    from canvasread.canvas.engine.client import EngineClient
    from canvasread.canvas.engine.loader import load_companions, resolve_device

    client = EngineClient.start(spec, settings)
    try:
        companions = load_companions(spec)
    except BaseException:
        client.close()
        raise
    ready = client.ready
    capacity = StoreCapacity(ready.pages, ready.page, CAPACITY_LIMIT)
    images = _image_tokens(companions.config, companions.image_processor)
    batches = settings.batches(on_gpu=resolve_device(settings.device).type == "cuda")
    engine = _Engine(client, client, images, capacity, batches, client.health_problem, client.close)
    return _runtime(companions.config, companions.tokenizer, ready.fingerprint, engine, settings, naive=False)


def _image_tokens(config: Any, processor: Any) -> ImageTokens | None:
    """How the checkpoint writes an image into a prompt (None: it has no image processor)."""
    from canvasread.canvas.engine.loader import soft_token_count

    if processor is None:
        return None
    ids = (int(config.boi_token_id), int(config.image_token_id), int(config.eoi_token_id))
    return ImageTokens(*ids, functools.partial(soft_token_count, processor))


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
