"""The model runner: fused passes of `Row`s over the KV store, and the start-up that warms every bucket.

One pass encodes prompt tokens and reads canvases together (`layers.py`),
laid out flat and padded to a bucket of the engine's one shape policy
(`Buckets`). `warm_up` runs, compiles and captures every bucket, and
`capture_flat` every flat pass shape once the KV store exists, before the
server is ready; after it, a recompile is a bug: it is counted (`compiles`),
logged, and the piece runs eagerly instead of stalling the request.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from canvasread.canvas.engine.graphs import Graph, PieceGraphs
from canvasread.canvas.engine.heads import SlotHead
from canvasread.canvas.engine.kvstore import KVStore
from canvasread.canvas.engine.layers import Buffers, LayerStack
from canvasread.canvas.engine.layout import FlatInputs, PassLayout, flat_masks, lay_out, padding_flat
from canvasread.canvas.engine.loader import process_images
from canvasread.canvas.engine.rows import NO_PAST, Row, RowOutput
from canvasread.canvas.engine.sampling import Scaled
from canvasread.canvas.engine.settings import Buckets

logger = logging.getLogger(__name__)

# Why a pass on a GPU ran without graphs: its bucket was not captured (a capture that failed at start-up).
MISS_REASONS = ("not_captured",)
# Warm-up rows are at most this long, so a large bucket is warmed by several rows (no giant attention).
WARM_ROW_TOKENS = 256
T = TypeVar("T")


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
        flat: bool | None = None,
    ) -> None:
        """`flat`: small passes attend flat (`layout.py`); None: where their whole graphs are captured (a GPU with
        `cuda_graphs`), since a flat pass run eagerly launches as much as a grouped one and computes more."""
        self.model = model
        self.image_processor = image_processor
        self.stack = LayerStack(model, compile=compile, fp8_experts=fp8_experts)
        self.head = SlotHead(model, compile=compile)
        self.buckets = buckets if buckets is not None else Buckets()
        self.buffers = self.stack.buffers(self.buckets.max_tokens)
        self.graphs = PieceGraphs() if cuda_graphs and self.stack.device.type == "cuda" else None
        self.flat = flat if flat is not None else self.graphs is not None
        self.ready = False
        self.compiles = 0
        self.flat_passes = 0
        self.misses: Counter[str] = Counter()
        self._captured_store: KVStore | None = None  # the store the flat passes' graphs read and write

    def counters(self) -> dict[str, float]:
        counted: dict[str, float] = {"compiles": self.compiles, "flat_passes": self.flat_passes}
        if self.graphs is not None:
            counted.update(graph_replays=self.graphs.replays, graph_captures=self.graphs.captures)
            counted.update({f"graph_misses/{reason}": self.misses[reason] for reason in MISS_REASONS})
        return counted

    @torch.inference_mode()
    def run(self, rows: Sequence[Row], store: KVStore) -> list[RowOutput]:
        """One pass over the layers for every row, padded to the smallest bucket that holds them all; a small
        pass attends flat (`layout.py`), replaying its whole graph where one was captured."""
        shape = self._flat_shape(rows, store)
        bucket = shape[0] if shape is not None else self.buckets.pad(sum(len(row.ids) for row in rows))
        stack = self.stack
        flat = (shape[1], store.scratch) if shape is not None else None
        layout = lay_out(rows, bucket=bucket, attention=stack.attention, flat=flat)
        views = self.buffers.view(bucket)
        if layout.flat is not None:
            stack.signals_into(layout, views)
            self._flat(layout.flat, views, store)
        else:
            stack.embed_into(layout, views)
            self._grouped(layout, views, store)
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

    def _flat_shape(self, rows: Sequence[Row], store: KVStore) -> tuple[int, int] | None:
        """The (tokens, past) shape a pass attends flat in, or None: it attends in groups when it holds an image,
        is too large, or, on a GPU, has no graph of its shape over `store` (a capture that failed at start-up
        leaves its shape to the grouped pass's piece graphs, not to a flat pass run eagerly)."""
        if not self.flat or any(row.images for row in rows):
            return None
        shape = self.buckets.flat_shape(sum(len(row.ids) for row in rows), sum(len(row.past) for row in rows))
        if shape is None or self.graphs is None:
            return shape
        return shape if store is self._captured_store and self.graphs.has_flat(shape) else None

    def _grouped(self, layout: PassLayout, views: Buffers, store: KVStore) -> None:
        """The layers of a pass that attends in groups: each layer's pieces replayed (or run), attention eager."""
        graphs = self.graphs.get(layout.size) if self.graphs is not None else None
        if self.graphs is not None and graphs is None and self.ready:
            self.misses["not_captured"] += 1
        self._layers(views, graphs, functools.partial(self.stack.attend, views=views, layout=layout, store=store))

    def _flat(self, flat: FlatInputs, views: Buffers, store: KVStore) -> None:
        """The layers of a flat pass: its whole graph replayed on a GPU (`_flat_shape` picks captured shapes
        only), else the layers run."""
        self.flat_passes += 1
        if self.graphs is not None:
            self.graphs.replay_flat(flat)
        else:
            self._flat_layers(flat, views, store)

    def _flat_layers(self, flat: FlatInputs, views: Buffers, store: KVStore) -> None:
        """A flat pass from its inputs on: embedding, masks, then every layer (what its graph holds)."""
        self.stack.embed_flat(flat, views)
        masks = flat_masks(flat, self.stack.attention)
        attend = functools.partial(self.stack.attend_flat, views=views, flat=flat, masks=masks, store=store)
        self._layers(views, None, attend)

    def _layers(self, views: Buffers, graphs: list[Graph] | None, attend: Callable[[int], None]) -> None:
        """Every layer: its `pre` piece, `attend(layer)`, its `post` piece (replayed from `graphs` where given)."""
        stack = self.stack
        with stack.attending():
            for index in range(len(stack.layers)):
                self._piece(stack.pre, index, views, graphs, 2 * index)
                attend(index)
                self._piece(stack.post, index, views, graphs, 2 * index + 1)

    def _piece(
        self,
        piece: Callable[[int, Buffers], None],
        index: int,
        views: Buffers,
        graphs: list[Graph] | None,
        number: int,
    ) -> None:
        """Replay a captured piece, or run it (guarded, where compiled)."""
        if graphs is not None:
            assert self.graphs is not None
            self.graphs.replay(graphs, number)
        elif self.stack.compiled:
            self._guarded(functools.partial(piece, index, views))
        else:
            piece(index, views)

    def scaled(self, normed: torch.Tensor, temperature: float) -> Scaled:
        """A denoising step's arithmetic over a canvas (`SlotHead.scaled`), guarded where compiled."""
        step = functools.partial(self.head.scaled, normed, temperature)
        return self._guarded(step) if self.head.compiled else step()

    def _guarded(self, call: Callable[[], T]) -> T:
        """Run compiled code; after warm-up a recompile is counted and logged, and the call runs eagerly."""
        if not self.ready:
            return call()
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return call()
        except RuntimeError as error:
            if "recompil" not in str(error).lower():
                raise
            self.compiles += 1
            logger.error("compiled code needed a compile after warm-up (a bug: it runs eagerly instead): %s", error)
            with torch.compiler.set_stance("force_eager"):
                return call()

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Pick each bucket's routed-expert product, then run every bucket once (compiling the pieces) and
        capture its graphs, before the first request.

        Random token ids in canvas rows of at most WARM_ROW_TOKENS tokens;
        nothing is written to the store, so a one-page store serves. Eager
        passes without graphs have nothing else to warm.
        """
        self.stack.choose_expert_products(self.buckets.tokens)
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
        self.head.warm_up()
        self.ready = True

    @torch.inference_mode()
    def capture_flat(self, store: KVStore) -> None:
        """Capture every flat pass shape whole over `store` (the graphs read and write it, so only passes over
        `store` replay them), before the first request; each is run eagerly first over inputs of padding alone,
        which warms its kernels."""
        if self.graphs is None or not self.flat:
            return
        self._captured_store = store
        for bucket, past in self.buckets.flat:
            inputs = padding_flat(bucket, past, store.scratch, self.stack.device)
            views = self.buffers.view(bucket)
            self._flat_layers(inputs, views, store)
            self.graphs.capture_flat(inputs, functools.partial(self._flat_layers, views=views, store=store))

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
