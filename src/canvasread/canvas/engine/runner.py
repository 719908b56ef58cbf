"""The model runner: fused passes of `Row`s over the KV store, and the start-up that warms every bucket.

One pass encodes prompt tokens and reads canvases together (`layers.py`),
laid out flat and padded to a bucket of the engine's one shape policy
(`Buckets`). `warm_up` runs, compiles and captures every bucket before the
server is ready; after it, a recompile is a bug: it is counted (`compiles`),
logged, and the piece runs eagerly instead of stalling the request.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from canvasread.canvas.engine.graphs import PieceGraphs
from canvasread.canvas.engine.heads import SlotHead
from canvasread.canvas.engine.kvstore import KVStore
from canvasread.canvas.engine.layers import Buffers, LayerStack
from canvasread.canvas.engine.layout import lay_out
from canvasread.canvas.engine.loader import process_images
from canvasread.canvas.engine.rows import NO_PAST, Row, RowOutput
from canvasread.canvas.engine.settings import Buckets

logger = logging.getLogger(__name__)

# Why a pass on a GPU ran without graphs: its bucket was not captured (a capture that failed at start-up).
MISS_REASONS = ("not_captured",)
# Warm-up rows are at most this long, so a large bucket is warmed by several rows (no giant attention).
WARM_ROW_TOKENS = 256


class FusedRunner:
    """Runs passes of `Row`s through a loaded `DiffusionGemmaForBlockDiffusion`, reusing its modules."""

    def __init__(
        self,
        model: Any,
        *,
        cuda_graphs: bool = False,
        image_processor: Any = None,
        compile: str | None = None,
        fp8_experts: bool = False,
        buckets: Buckets | None = None,
    ) -> None:
        self.model = model
        self.image_processor = image_processor
        self.stack = LayerStack(model, compile=compile, fp8_experts=fp8_experts)
        self.head = SlotHead(model)
        self.buckets = buckets if buckets is not None else Buckets()
        self.buffers = self.stack.buffers(self.buckets.max_tokens)
        self.graphs = PieceGraphs() if cuda_graphs and self.stack.device.type == "cuda" else None
        self.ready = False
        self.compiles = 0
        self.misses: Counter[str] = Counter()

    def counters(self) -> dict[str, float]:
        counted: dict[str, float] = {"compiles": self.compiles}
        if self.graphs is not None:
            counted.update(graph_replays=self.graphs.replays, graph_captures=self.graphs.captures)
            counted.update({f"graph_misses/{reason}": self.misses[reason] for reason in MISS_REASONS})
        return counted

    @torch.inference_mode()
    def run(self, rows: Sequence[Row], store: KVStore) -> list[RowOutput]:
        """One pass over the layers for every row, padded to the smallest bucket that holds them all."""
        bucket = self.buckets.pad(sum(len(row.ids) for row in rows))
        stack = self.stack
        layout = lay_out(rows, bucket=bucket, attention=stack.attention)
        views = self.buffers.view(bucket)
        stack.embed_into(layout, views)
        graphs = self.graphs.get(bucket) if self.graphs is not None else None
        if self.graphs is not None and graphs is None and self.ready:
            self.misses["not_captured"] += 1
        with stack.attending():
            for index in range(len(stack.layers)):
                self._piece(stack.pre, index, views, graphs, 2 * index)
                stack.attend(index, views, layout, store)
                self._piece(stack.post, index, views, graphs, 2 * index + 1)
        hidden = views.hidden
        slot_tokens = [start + p for row, start in zip(rows, layout.starts, strict=True) for p in row.slot_positions]
        logprobs = self.head.label_logprobs(hidden[slot_tokens], [ids for row in rows for ids in row.label_ids])
        outputs, cursor = [], 0
        for row, start in zip(rows, layout.starts, strict=True):
            count = len(row.slot_positions)
            canvas = self.head.norm(hidden[start : start + len(row.ids)]) if row.canvas_hidden else None
            outputs.append(RowOutput(logprobs[cursor : cursor + count], canvas))
            cursor += count
        return outputs

    def _piece(
        self,
        piece: Callable[[int, Buffers], None],
        index: int,
        views: Buffers,
        graphs: list[torch.cuda.CUDAGraph] | None,
        number: int,
    ) -> None:
        """Replay a captured piece, or run it; after warm-up a recompile is counted and the piece runs eagerly."""
        if graphs is not None:
            assert self.graphs is not None
            self.graphs.replay(graphs, number)
            return
        if not (self.ready and self.stack.compiled):
            piece(index, views)
            return
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                piece(index, views)
        except RuntimeError as error:
            if "recompil" not in str(error).lower():
                raise
            self.compiles += 1
            logger.error("a pass needed a compile after warm-up (a bug: it runs eagerly instead): %s", error)
            with torch.compiler.set_stance("force_eager"):
                piece(index, views)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run every bucket once (compiling the pieces) and capture its graphs, before the first request.

        Random token ids in canvas rows of at most WARM_ROW_TOKENS tokens;
        nothing is written to the store, so a one-page store serves. Eager
        passes without graphs have nothing to warm.
        """
        if not (self.stack.compiled or self.graphs is not None):
            self.ready = True
            return
        generator = torch.Generator().manual_seed(0)
        vocab = self.head.vocab
        scratch = KVStore(
            self.stack.kv_shapes(),
            pages=1,
            page=self.buckets.page,
            dtype=self.stack.embed.weight.dtype,
            device=self.stack.device,
        )
        for bucket in self.buckets.tokens:
            sizes = [WARM_ROW_TOKENS] * (bucket // WARM_ROW_TOKENS) + [bucket % WARM_ROW_TOKENS]
            rows = [
                Row(NO_PAST, torch.randint(3, vocab, (size,), generator=generator).tolist(), None, (0,), ((5, 6),))
                for size in sizes
                if size
            ]
            self.run(rows, scratch)
            if self.graphs is not None:
                self.graphs.capture(self.stack, self.buffers.view(bucket), bucket)
        self.ready = True

    @torch.inference_mode()
    def image_features(self, images: Sequence[bytes]) -> list[torch.Tensor]:
        """The vision tower's output for each image, one [soft tokens, hidden] tensor each."""
        processed = process_images(self.image_processor, images)
        device = self.stack.device
        encoder = self.model.model.encoder
        dtype = self.stack.embed.weight.dtype
        output = encoder.get_image_features(
            processed["pixel_values"].to(device, dtype), processed["image_position_ids"].to(device)
        )
        counts = [int(n) for n in processed["num_soft_tokens_per_image"]]
        return list(torch.split(output.pooler_output, counts))
