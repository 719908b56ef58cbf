"""CUDA graphs for the fused pass at small batch sizes, where launching kernels costs more than running them.

A pass of a batch of one launches about five thousand kernels; replaying a
captured graph launches them at the cost of one. Graphs need fixed shapes and
fixed addresses, so a pass is padded to a bucket — rows to a power of two,
new tokens and cached-prefix tokens to multiples of `length_step` — and its
inputs are copied into static buffers before each replay. The cached prefix
(the instruction part that all rows of such a pass share) is copied into a
static buffer per prefix bucket too (a few tens of MB: microseconds), so one
graph serves every question set of that size. Padding rows, tokens and prefix
slots are masked out of attention and their outputs never read, so a replay
gives what the eager pass gives.

Off CUDA (`capture=False`) the same static-buffer path runs eagerly, which is
how the tests check it on a CPU. A shape whose capture fails runs eagerly.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from canvasread.canvas.engine.layers import LayerStack
from canvasread.canvas.engine.rows import PassInputs, PassOutputs, PassShape, PromptKV, Row

logger = logging.getLogger(__name__)

PastBuffers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Entry:
    replay: Callable[[], None]
    inputs: PassInputs
    outputs: PassOutputs | None


class GraphCache:
    """Captured passes by bucket (rows, new tokens, prefix tokens), least recently used evicted first."""

    def __init__(
        self,
        *,
        capture: bool = True,
        max_batch: int = 64,
        length_step: int = 32,
        max_length: int = 512,
        max_graphs: int = 64,
    ) -> None:
        self.capture = capture
        self.max_batch = max_batch
        self.length_step = length_step
        self.max_length = max_length
        self.max_graphs = max_graphs
        self._entries: OrderedDict[tuple[int, int, int], _Entry] = OrderedDict()
        self._failed: set[tuple[int, int, int]] = set()
        self._past: dict[int, PastBuffers] = {}
        self._pool: Any = None
        self.replays = 0
        self.captures = 0

    def run(self, stack: LayerStack, rows: Sequence[Row]) -> PassOutputs | None:
        """Replay (capturing first if needed) a graph for these rows, or None when they do not fit one."""
        shared = rows[0].past
        # A self-conditioned pass (a multi-step read's later steps) runs eagerly: the graphs capture a zero signal.
        if len(rows) > self.max_batch or any(
            row.past is not shared or row.images or row.self_conditioning is not None for row in rows
        ):
            return None
        exact = PassShape.of(rows)
        if exact.new > self.max_length or exact.past > self.max_length:
            return None
        shape = PassShape(1 << math.ceil(math.log2(len(rows))), self._bucket(exact.new), self._bucket(exact.past))
        key = (shape.batch, shape.new, shape.past)
        if key in self._failed:
            return None
        past = self._fill_past(shared, shape.past)
        fresh = stack.prepare(rows, shape, filter_padding=False, past=past)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._record(stack, rows, fresh, key)
            if entry is None:
                return None
        else:
            self._entries.move_to_end(key)
            entry.inputs.tokens.copy_(fresh.tokens)
            entry.inputs.positions.copy_(fresh.positions)
            entry.inputs.is_canvas.copy_(fresh.is_canvas)
            for kind, mask in fresh.masks.items():
                entry.inputs.masks[kind].copy_(mask)
        entry.replay()
        self.replays += 1
        assert entry.outputs is not None
        return entry.outputs

    def _bucket(self, length: int) -> int:
        return math.ceil(length / self.length_step) * self.length_step

    def _fill_past(self, shared: PromptKV | None, bucket: int) -> PastBuffers | None:
        """Copy the shared prefix into the static buffers of its bucket (allocated on first use)."""
        if shared is None or bucket == 0:
            return None
        buffers = self._past.get(bucket)
        if buffers is None:
            buffers = [
                (k.new_zeros(1, k.shape[0], bucket, k.shape[-1]), v.new_zeros(1, v.shape[0], bucket, v.shape[-1]))
                for k, v in zip(shared.keys, shared.values, strict=True)
            ]
            self._past[bucket] = buffers
        for (key_buffer, value_buffer), keys, values in zip(buffers, shared.keys, shared.values, strict=True):
            key_buffer[0, :, : shared.length].copy_(keys)
            value_buffer[0, :, : shared.length].copy_(values)
        return buffers

    def _record(
        self, stack: LayerStack, rows: Sequence[Row], inputs: PassInputs, key: tuple[int, int, int]
    ) -> _Entry | None:
        if not self.capture:
            entry = _Entry(lambda: None, inputs, None)

            def rerun() -> None:
                entry.outputs = stack.forward(rows, entry.inputs)

            entry.replay = rerun
        else:
            try:
                side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    stack.forward(rows, inputs)  # warm-up: lazy handles and workspaces are made outside capture
                torch.cuda.current_stream().wait_stream(side)
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    outputs = stack.forward(rows, inputs)
            except Exception:
                logger.warning("CUDA graph capture failed for %s; that shape runs eagerly", key, exc_info=True)
                self._failed.add(key)
                return None
            entry = _Entry(graph.replay, inputs, outputs)
        self._entries[key] = entry
        self.captures += 1
        while len(self._entries) > self.max_graphs:
            self._entries.popitem(last=False)
        return entry
