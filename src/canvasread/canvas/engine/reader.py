"""The in-process `Reader` and `Thinker`: calls handed to the engine's core loop, which packs every caller's work
into fused passes over the paged KV store (`core.py`).

A `read` places each distinct prompt in the store once (cached, a cached
prefix continued, or encoded in rows: `prompts.py`) and reads every canvas
against it; a multi-step read comes back for its next step in a later
pass. A `think` writes each thought as `generate` would, a denoising pass
at a time (`generation.py`). Calls from several threads at once (the
canvas backend runs several batches at a time over this reader) share the
passes; each call returns when its own reads or thoughts are done. The
reads or thoughts of a caller who has left (`gone`) are dropped between
passes and get an empty result (`canvasread.canvas.reader.StoppingReader`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.engine.core import EngineCore, EngineLoop
from canvasread.canvas.engine.kvstore import KVStore, PromptCache
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import DEFAULT_CPU_CACHE_BYTES, DEFAULT_MAX_ROWS, DEFAULT_THOUGHT_SHARE
from canvasread.canvas.engine.works import ReadWork, ThoughtWork
from canvasread.canvas.reader import CanvasRead, SlotLogProbs
from canvasread.canvas.thinker import Thought, ThoughtRequest

# The share of a GPU's memory free after loading and warm-up that the KV store takes by default.
GPU_CACHE_SHARE = 0.4


class InProcessReader:
    """Executes `CanvasRead`s (and, through `EngineThinker`, thoughts) on one `FusedRunner`: one per model
    replica, callable from any number of threads."""

    stops_departed_reads = True

    def __init__(
        self,
        runner: FusedRunner,
        *,
        cache_bytes: int | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        pass_tokens: int | None = None,
        thought_share: float = DEFAULT_THOUGHT_SHARE,
    ) -> None:
        stack = runner.stack
        shapes = stack.kv_shapes()
        dtype = stack.embed.weight.dtype
        page = runner.buckets.page
        budget = cache_bytes if cache_bytes is not None else _default_cache_bytes(stack.device)
        pages = max(1, budget // (KVStore.bytes_per_token(shapes, dtype) * page))
        store = KVStore(shapes, pages=pages, page=page, dtype=dtype, device=stack.device)
        runner.capture_flat(store)
        self.loop = EngineLoop(
            EngineCore(runner, store, max_rows=max_rows, pass_tokens=pass_tokens, thought_share=thought_share)
        )

    @property
    def runner(self) -> FusedRunner:
        return self.loop.core.runner

    @property
    def store(self) -> KVStore:
        return self.loop.core.table.store

    @property
    def cache(self) -> PromptCache:
        return self.loop.core.table.cache

    def counters(self) -> Mapping[str, float]:
        counted = dict(self.loop.core.counters())
        counted.update(self.runner.counters())
        return counted

    def read(self, reads: Sequence[CanvasRead], gone: Gone = never_gone) -> list[list[SlotLogProbs]]:
        if not reads:
            return []
        work = ReadWork(reads, gone)
        self.loop.submit(work)
        return [result if result is not None else [] for result in work.wait()]


class EngineThinker:
    """The `Thinker` of the in-process engine: thoughts written by the reader's own loop, beside its reads."""

    def __init__(self, reader: InProcessReader) -> None:
        self.loop = reader.loop

    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]:
        if not requests:
            return []
        work = ThoughtWork(requests, gone)
        self.loop.submit(work)
        return work.wait()


def _default_cache_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_CPU_CACHE_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * GPU_CACHE_SHARE)
