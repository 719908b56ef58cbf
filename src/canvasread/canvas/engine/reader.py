"""The in-process `Reader`: schedules canvas reads onto the fused runner, with a bounded prefix cache.

Per distinct prompt in a batch:
- its full KV is cached (a re-read): every canvas reads it, no prompt work;
- else the longest cached prefix (the instruction part shared by requests
  with the same questions) is continued with the rest of the prompt. A prompt
  with one canvas does that *and* reads the canvas in the same pass; a prompt
  with several is encoded first, then all its canvases read its KV.
Encoded prompts are kept (LRU, bounded in bytes) so re-reads and later
requests with the same questions skip the encoder.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from canvasread.canvas.engine.rows import PromptKV, Row, RowOutput
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.steps import Denoising, Schedule
from canvasread.canvas.reader import CanvasRead, PromptImage, SlotLogProbs

# A row of a pass, the prompt it encodes or reads (None: a later step, whose KV its read holds) and its read.
_PassRow = tuple[Row, "_PromptWork | None", int | None]


class KVCache:
    """LRU map from token prefixes to encoded KV, bounded by total bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, PromptKV] = OrderedDict()
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, key: Hashable) -> PromptKV | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, kv: PromptKV) -> None:
        if key in self._entries or kv.nbytes > self.max_bytes:
            return
        self._entries[key] = kv
        self._bytes += kv.nbytes
        while self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes


@dataclass
class ReaderCounters:
    reads: int = 0
    encoder_runs: int = 0
    prompt_tokens_encoded: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_misses: int = 0
    prompt_cache_hits: int = 0
    passes: int = 0
    images_encoded: int = 0
    denoising_steps: int = 0


@dataclass
class _PromptWork:
    prompt: tuple[int, ...]
    prefix_length: int
    images: tuple[PromptImage, ...]
    reads: list[int] = field(default_factory=list)
    kv: PromptKV | None = None  # once encoded (or found cached): what its canvases read

    @property
    def key(self) -> tuple[object, ...]:
        return (self.prompt, tuple(image.digest for image in self.images))


class InProcessReader:
    """Executes `CanvasRead`s on a `FusedRunner`; one instance per model replica, used from one thread."""

    def __init__(self, runner: FusedRunner, *, cache_bytes: int = 2 << 30, max_rows: int = 256) -> None:
        self.runner = runner
        self.prefixes = KVCache(cache_bytes // 2)
        self.prompts = KVCache(cache_bytes // 2)
        self.max_rows = max_rows
        self.stats = ReaderCounters()
        self.schedule = Schedule.of(runner.model)

    def counters(self) -> Mapping[str, float]:
        counted: dict[str, float] = dict(vars(self.stats))
        graphs = self.runner.graphs
        if graphs is not None:
            counted.update(graph_replays=graphs.replays, graph_captures=graphs.captures)
        return counted

    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        work: dict[tuple[object, ...], _PromptWork] = {}
        for index, read in enumerate(reads):
            item = _PromptWork(read.prompt_ids, read.prefix_length, read.images)
            work.setdefault(item.key, item).reads.append(index)
        results: list[list[SlotLogProbs] | None] = [None] * len(reads)
        device = self.runner.stack.device
        steps = {i: Denoising(read, device) for i, read in enumerate(reads) if read.steps > 1}
        first, later = self._first_pass(reads, work.values(), steps)
        self._execute(first, results, steps)
        second = [(_row(item.kv, (), reads[i], steps.get(i)), item, i) for item in later for i in item.reads]
        self._execute(second, results, steps)
        while steps:  # the later steps of multi-step reads, each over its prompt's KV (encoded once)
            self._execute(
                [(_row(state.kv, (), state.read, state), None, i) for i, state in steps.items()], results, steps
            )
        self.stats.reads += len(reads)
        return [r for r in results if r is not None]

    def _first_pass(
        self, reads: Sequence[CanvasRead], work: Iterable[_PromptWork], steps: Mapping[int, Denoising]
    ) -> tuple[list[_PassRow], list[_PromptWork]]:
        """The first pass's rows, and the prompts whose canvases wait for a second pass over their encoding."""
        first: list[_PassRow] = []
        later: list[_PromptWork] = []
        for item in work:
            cached = self.prompts.get(item.key)
            if cached is not None:
                self.stats.prompt_cache_hits += 1
                item.kv = cached
                first += [(_row(cached, (), reads[i], steps.get(i)), item, i) for i in item.reads]
                continue
            past = self._cached_prefix(item)
            start = past.length if past is not None else 0
            new_tokens = item.prompt[start:]
            images = self._image_rows(item, start)
            if len(item.reads) == 1:
                i = item.reads[0]
                first.append((_row(past, new_tokens, reads[i], steps.get(i), keep_kv=True, images=images), item, i))
            else:
                first.append((Row(past, new_tokens, (), (), (), True, images), item, None))
                later.append(item)
            self.stats.encoder_runs += 1
            self.stats.prompt_tokens_encoded += len(new_tokens)
        return first, later

    def _image_rows(self, item: _PromptWork, start: int) -> tuple[tuple[int, Any], ...]:
        """Vision-tower features for the images among the tokens this pass encodes (offsets from `start`)."""
        if not item.images:
            return ()
        features = self.runner.image_features([image.data for image in item.images])
        self.stats.images_encoded += len(item.images)
        return tuple((image.start - start, tensor) for image, tensor in zip(item.images, features, strict=True))

    def _cached_prefix(self, item: _PromptWork) -> PromptKV | None:
        if item.prefix_length <= 0:
            return None
        kv = self.prefixes.get(item.prompt[: item.prefix_length])
        if kv is None:
            self.stats.prefix_cache_misses += 1
        else:
            self.stats.prefix_cache_hits += 1
        return kv

    def _execute(
        self, rows: Sequence[_PassRow], results: list[list[SlotLogProbs] | None], steps: dict[int, Denoising]
    ) -> None:
        """Run rows in passes of `max_rows`; a read-only row gives its read's result, any other a denoising step."""
        for start in range(0, len(rows), self.max_rows):
            chunk = rows[start : start + self.max_rows]
            outputs = self.runner.run([row for row, _, _ in chunk])
            self.stats.passes += 1
            for (_, item, read_index), output in zip(chunk, outputs, strict=True):
                if item is not None:
                    self._remember(item, output)
                if read_index is None:
                    continue
                if output.canvas_hidden is None:
                    results[read_index] = [SlotLogProbs(tuple(t.tolist())) for t in output.label_logprobs]
                    steps.pop(read_index, None)
                    continue
                state = steps[read_index]
                if item is not None:
                    state.kv = item.kv
                state.advance(self.runner.logits(output.canvas_hidden), self.schedule, self.runner.stack.embed)
                self.stats.denoising_steps += 1

    def _remember(self, item: _PromptWork, output: RowOutput) -> None:
        if output.kv is None:
            return
        item.kv = output.kv
        self.prompts.put(item.key, output.kv)
        if 0 < item.prefix_length < len(item.prompt):
            key = item.prompt[: item.prefix_length]
            if self.prefixes.get(key) is None:
                self.prefixes.put(key, output.kv.prefix(item.prefix_length))


def _row(
    past: PromptKV | None,
    prompt_ids: Sequence[int],
    read: CanvasRead,
    state: Denoising | None,
    *,
    keep_kv: bool = False,
    images: Sequence[tuple[int, Any]] = (),
) -> Row:
    """The row that reads `read`'s canvas: read-only at the slots, or (a multi-step read's earlier step) the whole
    canvas's hidden states for the denoising step, self-conditioned on the step before."""
    if state is None:
        return Row(past, prompt_ids, read.canvas_ids, _positions(read), _labels(read), keep_kv, images)
    positions, labels = (_positions(read), _labels(read)) if state.last else ((), ())
    canvas = state.canvas_ids()
    return Row(past, prompt_ids, canvas, positions, labels, keep_kv, images, state.signal, not state.last)


def _positions(read: CanvasRead) -> tuple[int, ...]:
    return tuple(slot.position for slot in read.slots)


def _labels(read: CanvasRead) -> tuple[tuple[int, ...], ...]:
    return tuple(slot.label_ids for slot in read.slots)
