"""Builds the canvas backend for an in-process checkpoint; nothing heavy is imported until `load()`."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path

from canvasread.backends.base import AnyBackend
from canvasread.backends.replicas import ReplicaSet
from canvasread.canvas.backend import CanvasBackend, CanvasRuntime, ReadSettings
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.planning import StoreCapacity
from canvasread.canvas.prompt import ImageTokens
from canvasread.canvas.reader import Reader
from canvasread.types import MAX_STEPS, Capabilities, ModelCard

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
    """Load the checkpoint and build its reader: the fused engine, or plain forwards for the naive baseline."""
    from canvasread.canvas.engine.loader import load_checkpoint
    from canvasread.canvas.engine.naive import NaiveReader
    from canvasread.canvas.engine.reader import InProcessReader
    from canvasread.canvas.engine.runner import FusedRunner
    from canvasread.canvas.engine.thinker import GenerateThinker
    from canvasread.canvas.tokenizer import HFTokenizer

    loaded = load_checkpoint(
        spec,
        device=settings.device,
        dtype=settings.dtype,
        experts=settings.experts,
        random_init_std=settings.random_init_std,
    )
    config = loaded.model.config
    reader: Reader
    images = None
    capacity = None
    if naive:
        reader = NaiveReader(loaded.model)
    else:
        on_cuda = next(loaded.model.parameters()).device.type == "cuda"
        runner = FusedRunner(
            loaded.model,
            cuda_graphs=settings.cuda_graphs,
            image_processor=loaded.image_processor,
            compile="inductor" if settings.compile and on_cuda else None,
            fp8_experts=settings.fp8_experts,
            buckets=settings.buckets,
        )
        runner.warm_up()  # every bucket compiled and captured before /ready; the store sized after it
        reader = InProcessReader(runner, cache_bytes=settings.cache_bytes, max_rows=settings.max_rows)
        capacity = StoreCapacity(reader.store.pages, reader.store.page, CAPACITY_LIMIT)
        if loaded.image_processor is not None:
            ids = (int(config.boi_token_id), int(config.image_token_id), int(config.eoi_token_id))
            images = ImageTokens(*ids, runner.image_token_count)
    tokenizer = HFTokenizer(loaded.tokenizer)
    return CanvasRuntime(
        reader=reader,
        tokenizer=tokenizer,
        canvas_length=int(config.canvas_length),
        max_positions=int(config.text_config.max_position_embeddings),
        # FP8 experts read different numbers: a calibration fit on bf16 reads does not carry over.
        fingerprint=loaded.fingerprint + ("-fp8-experts" if settings.fp8_experts and not naive else ""),
        images=images,
        thinker=GenerateThinker(loaded.model, pad_id=tokenizer.pad_id, image_processor=loaded.image_processor),
        capacity=capacity,
    )


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
