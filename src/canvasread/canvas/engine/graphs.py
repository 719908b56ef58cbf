"""CUDA graphs of the token-wise pieces of a pass, one set per bucket, captured at start-up.

A pass of a few rows launches thousands of kernels; replaying captured
graphs launches each piece at the cost of one. Each layer's `pre` and
`post` (`layers.py`) are captured for every token bucket over the same
fixed buffers, sharing one memory pool; attention, whose shapes follow the
rows, runs eagerly between them. A pass is padded to its bucket, so any
mix of prompts and lengths replays the same graphs; padding tokens' outputs
are never read, and no real token attends to them.

A flat pass (`layout.py`) is captured whole, once per (tokens, past) bucket,
after the KV store exists (the graph reads and writes it), its embedding
included: its inputs (token ids, roles, past keys) are copied into the
graph's own before each replay, the canvas rows' self-conditioning into the
buffer the graph reads.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

from canvasread.canvas.engine.layers import Buffers, LayerStack
from canvasread.canvas.engine.layout import FlatInputs

logger = logging.getLogger(__name__)


class Graph(Protocol):
    """What a capture gives: the recorded work, run again over the memory it was recorded on."""

    def replay(self) -> None: ...


class PieceGraphs:
    """Captured pieces by bucket: for layer l, `pre` at index 2l and `post` at 2l + 1."""

    def __init__(self) -> None:
        self._graphs: dict[int, list[Graph]] = {}
        self._flat: dict[tuple[int, int], tuple[Graph, FlatInputs]] = {}
        self._pool: Any = None
        self.captures = 0
        self.replays = 0

    def get(self, bucket: int) -> list[Graph] | None:
        return self._graphs.get(bucket)

    def record(self, run: Callable[[], None]) -> Graph:
        """`run` captured as a CUDA graph in the shared pool (the one place anything is captured)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            run()
        return graph

    def capture(self, stack: LayerStack, views: Buffers, bucket: int) -> bool:
        """Capture every piece of a bucket (after an eager pass of it has warmed the kernels); False if it failed."""
        try:
            graphs = [
                self.record(functools.partial(piece, index, views))
                for index in range(len(stack.layers))
                for piece in (stack.pre, stack.post)
            ]
        except Exception:
            logger.warning("capturing the pieces of bucket %d failed; it runs without graphs", bucket, exc_info=True)
            return False
        self._graphs[bucket] = graphs
        self.captures += len(graphs)
        return True

    def replay(self, graphs: list[Graph], index: int) -> None:
        graphs[index].replay()
        self.replays += 1

    @property
    def pool(self) -> Any:
        """The memory pool every graph shares (they never run at once)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def capture_flat(self, inputs: FlatInputs, run: Callable[[FlatInputs], None]) -> bool:
        """Capture `run` of a flat pass over `inputs` (kept: each replay's inputs are copied into them), after an
        eager run has warmed its kernels; False if it failed."""
        shape = (int(inputs.tokens.shape[1]), int(inputs.past.shape[1]))
        try:
            graph = self.record(functools.partial(run, inputs))
        except Exception:
            logger.warning("capturing the flat pass %s failed; it runs without a graph", shape, exc_info=True)
            return False
        self._flat[shape] = (graph, inputs)
        self.captures += 1
        return True

    def has_flat(self, shape: tuple[int, int]) -> bool:
        """Whether the flat pass of this (tokens, past) shape was captured."""
        return shape in self._flat

    def replay_flat(self, flat: FlatInputs) -> None:
        """Replay the captured flat pass of `flat`'s shape with `flat`'s inputs."""
        graph, inputs = self._flat[(int(flat.tokens.shape[1]), int(flat.past.shape[1]))]
        inputs.past.copy_(flat.past)
        inputs.tokens.copy_(flat.tokens)
        graph.replay()
        self.replays += 1
