"""CUDA graphs of the token-wise pieces of a pass, one set per bucket, captured at start-up.

A pass of a few rows launches thousands of kernels; replaying captured
graphs launches each piece at the cost of one. Each layer's `pre` and
`post` (`layers.py`) are captured for every token bucket over the same
fixed buffers, sharing one memory pool; attention, whose shapes follow the
rows, runs eagerly between them. A pass is padded to its bucket, so any
mix of prompts and lengths replays the same graphs; padding tokens' outputs
are never read, and no real token attends to them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from canvasread.canvas.engine.layers import Buffers, LayerStack

logger = logging.getLogger(__name__)


class PieceGraphs:
    """Captured pieces by bucket: for layer l, `pre` at index 2l and `post` at 2l + 1."""

    def __init__(self) -> None:
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self._pool: Any = None
        self.captures = 0
        self.replays = 0

    def get(self, bucket: int) -> list[torch.cuda.CUDAGraph] | None:
        return self._graphs.get(bucket)

    def capture(self, stack: LayerStack, views: Buffers, bucket: int) -> bool:
        """Capture every piece of a bucket (after an eager pass of it has warmed the kernels); False if it failed."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graphs = []
        try:
            for index in range(len(stack.layers)):
                for piece in (stack.pre, stack.post):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self._pool):
                        piece(index, views)
                    graphs.append(graph)
        except Exception:
            logger.warning("capturing the pieces of bucket %d failed; it runs without graphs", bucket, exc_info=True)
            return False
        self._graphs[bucket] = graphs
        self.captures += len(graphs)
        return True

    def replay(self, graphs: list[torch.cuda.CUDAGraph], index: int) -> None:
        graphs[index].replay()
        self.replays += 1
