"""The in-process `Reader`: packs canvas reads into fused passes over the paged KV store.

Per distinct prompt of a call:
- its whole KV is cached (a re-read, or a later request with the same
  prompt): its canvases read the stored slots, no prompt work;
- else the longest cached prefix (the instruction part shared by requests
  with the same questions) is continued: the prompt gets slots of its own
  for the rest only, encoded in rows of at most ENCODE_ROW_TOKENS tokens
  (an image is never cut).
Passes are packed in order up to the bucket policy's `max_tokens` and
`max_rows`: a prompt's encoding rows, then the reads of every prompt whose
encoding is done or in the same pass (the store is written before any
attention reads it). A multi-step read comes back for its next step in a
later pass. Encoded prompts stay in the store (LRU by pages) for re-reads
and later requests. Before each pass the reads whose caller has left
(`gone`) are dropped with their prompts' encoding rows not yet run, and get
an empty result (`canvasread.canvas.reader.StoppingReader`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.engine.kvstore import KVStore, PromptCache, StoredKV
from canvasread.canvas.engine.rows import Row, RowOutput
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import DEFAULT_CPU_CACHE_BYTES, DEFAULT_MAX_ROWS
from canvasread.canvas.engine.steps import Denoising, Schedule
from canvasread.canvas.reader import CanvasRead, PromptImage, SlotLogProbs

# The longest row one prompt encodes in a pass: bounds a row's attention scores (queries x keys).
ENCODE_ROW_TOKENS = 2048
# The share of a GPU's memory free after loading and warm-up that the KV store takes by default.
GPU_CACHE_SHARE = 0.4


@dataclass
class ReaderCounters:
    reads: int = 0
    encoder_runs: int = 0
    prompt_tokens_encoded: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_misses: int = 0
    prompt_cache_hits: int = 0
    passes: int = 0
    pass_tokens: int = 0
    images_encoded: int = 0
    denoising_steps: int = 0


@dataclass
class _Prompt:
    ids: tuple[int, ...]
    prefix_length: int
    images: tuple[PromptImage, ...]
    reads: list[int] = field(default_factory=list)
    entry: StoredKV | None = None  # its slots in the store, held by this call
    chunks: deque[Row] = field(default_factory=deque)  # encoding rows not yet run
    fresh: bool = False  # encoded by this call: kept in the cache once its last chunk has run

    @property
    def key(self) -> tuple[object, ...]:
        return (self.ids, tuple(image.digest for image in self.images))


@dataclass
class _Task:
    index: int
    read: CanvasRead
    prompt: _Prompt
    state: Denoising | None


class InProcessReader:
    """Executes `CanvasRead`s on a `FusedRunner`; one instance per model replica, used from one thread."""

    stops_departed_reads = True

    def __init__(
        self, runner: FusedRunner, *, cache_bytes: int | None = None, max_rows: int = DEFAULT_MAX_ROWS
    ) -> None:
        self.runner = runner
        stack = runner.stack
        shapes = stack.kv_shapes()
        dtype = stack.embed.weight.dtype
        page = runner.buckets.page
        budget = cache_bytes if cache_bytes is not None else _default_cache_bytes(stack.device)
        pages = max(1, budget // (KVStore.bytes_per_token(shapes, dtype) * page))
        self.store = KVStore(shapes, pages=pages, page=page, dtype=dtype, device=stack.device)
        self.cache = PromptCache(self.store)
        self.max_rows = max_rows
        self.stats = ReaderCounters()
        self.schedule = Schedule.of(runner.model)

    def counters(self) -> Mapping[str, float]:
        counted: dict[str, float] = dict(vars(self.stats))
        counted.update(self.runner.counters())
        counted.update(kv_cache_entries=len(self.cache), kv_store_free_pages=self.store.free_pages)
        return counted

    @torch.inference_mode()
    def read(self, reads: Sequence[CanvasRead], gone: Gone = never_gone) -> list[list[SlotLogProbs]]:
        prompts: dict[tuple[object, ...], _Prompt] = {}
        for index, read in enumerate(reads):
            item = _Prompt(read.prompt_ids, read.prefix_length, read.images)
            prompts.setdefault(item.key, item).reads.append(index)
        device = self.runner.stack.device
        tasks = deque(
            _Task(i, reads[i], item, Denoising(reads[i], device) if reads[i].steps > 1 else None)
            for item in prompts.values()
            for i in item.reads
        )
        results: list[list[SlotLogProbs] | None] = [None] * len(reads)
        held: list[StoredKV] = []
        try:
            for item in prompts.values():
                held.append(self._place(item))
            while _drop_gone(tasks, prompts.values(), gone, results):
                self._pass(list(prompts.values()), tasks, results)
        finally:
            for entry in held:
                self.store.release(entry)
        self.stats.reads += len(reads)
        return [result for result in results if result is not None]

    def _place(self, item: _Prompt) -> StoredKV:
        """The prompt's slots (cached, or allocated after its cached prefix with encoding rows for the rest)."""
        cached = self.cache.get(item.key)
        if cached is not None:
            self.stats.prompt_cache_hits += 1
            item.entry = cached
            return cached
        past = self._cached_prefix(item)
        start = past.length if past is not None else 0
        self.cache.make_room(-(-(len(item.ids) - start) // self.store.page))
        entry = self.store.allocate(past, len(item.ids) - start)
        if past is not None:
            self.store.release(past)  # the entry holds the prefix's pages now
        item.entry, item.fresh = entry, True
        item.chunks.extend(self._chunks(item, entry, start))
        self.stats.encoder_runs += 1
        self.stats.prompt_tokens_encoded += len(item.ids) - start
        return entry

    def _chunks(self, item: _Prompt, entry: StoredKV, start: int) -> list[Row]:
        """Rows encoding `item.ids[start:]`, each at most ENCODE_ROW_TOKENS long unless an image needs more."""
        longest = min(ENCODE_ROW_TOKENS, self.runner.buckets.max_tokens)
        images = [image for image in item.images if image.start >= start]
        features = self.runner.image_features([image.data for image in images]) if images else []
        self.stats.images_encoded += len(images)
        rows = []
        while start < len(item.ids):
            end = min(start + longest, len(item.ids))
            for image in images:  # never cut an image: end before it, or (if it starts the row) after it
                if image.start < end < image.start + image.tokens:
                    end = image.start if image.start > start else image.start + image.tokens
            overlays = [
                (image.start - start, tensor)
                for image, tensor in zip(images, features, strict=True)
                if start <= image.start < end
            ]
            rows.append(Row(entry.slots[:start], item.ids[start:end], entry.slots[start:end], images=overlays))
            start = end
        return rows

    def _cached_prefix(self, item: _Prompt) -> StoredKV | None:
        if item.prefix_length <= 0 or item.prefix_length >= len(item.ids):
            return None
        past = self.cache.get(("prefix", item.ids[: item.prefix_length]))
        if past is None:
            self.stats.prefix_cache_misses += 1
        else:
            self.stats.prefix_cache_hits += 1
        return past

    def _pass(self, prompts: Sequence[_Prompt], tasks: deque[_Task], results: list[list[SlotLogProbs] | None]) -> None:
        """Pack and run one pass: encoding rows first, then the reads whose prompts are encoded by then.

        Both are taken a row per prompt in turn, so no one prompt (one request, or one of its samples' many
        canvases) fills a pass while the others of the call wait.
        """
        budget, rows = self.runner.buckets.max_tokens, 0
        encoding: list[tuple[Row, _Prompt]] = []
        for item in _interleaved([(prompt, prompt) for prompt in prompts for _ in prompt.chunks]):
            chunk = item.chunks[0]
            if len(chunk.ids) > budget or rows >= self.max_rows:
                continue
            encoding.append((item.chunks.popleft(), item))
            budget, rows = budget - len(chunk.ids), rows + 1
        reading: list[tuple[Row, _Task]] = []
        waiting: deque[_Task] = deque()
        for task in _interleaved([(task.prompt, task) for task in tasks]):
            row = _read_row(task)
            if task.prompt.chunks or len(row.ids) > budget or rows >= self.max_rows:
                waiting.append(task)
                continue
            reading.append((row, task))
            budget, rows = budget - len(row.ids), rows + 1
        tasks.clear()
        tasks.extend(waiting)
        if not encoding and not reading:
            raise ValueError(f"a read is over the largest bucket of {self.runner.buckets.max_tokens} tokens")
        outputs = self.runner.run([row for row, _ in encoding] + [row for row, _ in reading], self.store)
        self.stats.passes += 1
        self.stats.pass_tokens += self.runner.buckets.max_tokens - budget
        for _, item in encoding:
            if not item.chunks and item.fresh:
                self._remember(item)
        for (_, task), output in zip(reading, outputs[len(encoding) :], strict=True):
            self._finish(task, output, tasks, results)

    def _finish(
        self, task: _Task, output: RowOutput, tasks: deque[_Task], results: list[list[SlotLogProbs] | None]
    ) -> None:
        """A read's result, or (a multi-step read's earlier step) its denoising step and a place in the queue."""
        if output.canvas_hidden is None:
            results[task.index] = [SlotLogProbs(tuple(t.tolist())) for t in output.label_logprobs]
            return
        assert task.state is not None
        task.state.advance(self.runner.head.logits(output.canvas_hidden), self.schedule, self.runner.stack.embed)
        self.stats.denoising_steps += 1
        tasks.append(task)

    def _remember(self, item: _Prompt) -> None:
        assert item.entry is not None
        item.fresh = False
        self.cache.put(item.key, item.entry)
        if 0 < item.prefix_length < len(item.ids):
            prefix = self.store.prefix(item.entry, item.prefix_length)
            self.cache.put(("prefix", item.ids[: item.prefix_length]), prefix)


def _drop_gone(
    tasks: deque[_Task], prompts: Iterable[_Prompt], gone: Gone, results: list[list[SlotLogProbs] | None]
) -> bool:
    """Drop the tasks whose caller has left (an empty result each) and the encoding rows no task waits for; true
    while any task is left. A prompt left half encoded is never cached: only a pass that runs its last row does."""
    kept: list[_Task] = []
    for task in tasks:
        if gone(task.index):
            results[task.index] = []
        else:
            kept.append(task)
    tasks.clear()
    tasks.extend(kept)
    waited = {id(task.prompt) for task in kept}
    for item in prompts:
        if id(item) not in waited:
            item.chunks.clear()
    return bool(tasks)


T = TypeVar("T")


def _interleaved(owned: Sequence[tuple[_Prompt, T]]) -> list[T]:
    """The items in turns, one per prompt a turn, each prompt's own in their order."""
    queues: dict[int, deque[T]] = {}
    for prompt, item in owned:
        queues.setdefault(id(prompt), deque()).append(item)
    turns: list[T] = []
    while queues:
        for key in list(queues):
            turns.append(queues[key].popleft())
            if not queues[key]:
                del queues[key]
    return turns


def _read_row(task: _Task) -> Row:
    """The row that reads a task's canvas: read-only at the slots, or (a multi-step read's earlier step) the
    whole canvas's hidden states for the denoising step, self-conditioned on the step before."""
    read, state = task.read, task.state
    assert task.prompt.entry is not None
    past = task.prompt.entry.slots
    positions = tuple(slot.position for slot in read.slots)
    labels = tuple(slot.label_ids for slot in read.slots)
    if state is None:
        return Row(past, read.canvas_ids, None, positions, labels)
    if not state.last:
        positions, labels = (), ()
    return Row(past, state.canvas_ids(), None, positions, labels, (), state.signal, not state.last)


def _default_cache_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_CPU_CACHE_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * GPU_CACHE_SHARE)
