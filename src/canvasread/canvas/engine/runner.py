"""The model runner: fused passes of `Row`s, their outputs, and the CUDA graphs that replay small ones.

One pass encodes uncached prompt tokens and reads canvases together
(`layers.py`); the LM head runs only at slot positions, and only the label
columns' log-probabilities leave the device. Small batches that share one
cached prefix replay captured graphs (`graphs.py`), which the runner owns.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch

from canvasread.canvas.engine.graphs import GraphCache
from canvasread.canvas.engine.layers import LayerStack
from canvasread.canvas.engine.rows import PassShape, PromptKV, Row, RowOutput
from canvasread.types import ImageAsset


class FusedRunner:
    """Runs batches of `Row`s through a loaded `DiffusionGemmaForBlockDiffusion`, reusing its modules."""

    def __init__(
        self,
        model: Any,
        *,
        cuda_graphs: bool = False,
        image_processor: Any = None,
        compile: str | None = None,
        fp8_experts: bool = False,
    ) -> None:
        self.model = model
        self.image_processor = image_processor
        self.stack = LayerStack(model, compile=compile, fp8_experts=fp8_experts)
        self.norm = model.model.encoder.language_model.norm
        self.lm_head = model.lm_head
        self.softcap = float(model.config.text_config.final_logit_softcapping or 0.0)
        self.graphs = GraphCache() if cuda_graphs and self.stack.device.type == "cuda" else None

    @torch.inference_mode()
    def run(self, rows: Sequence[Row]) -> list[RowOutput]:
        """One pass over the layers for every row; rows of any lengths are padded into one batch.

        Small batches that share one cached prefix replay CUDA graphs when enabled (`graphs`).
        """
        prompt_lengths = [len(row.prompt_ids) for row in rows]
        graphed = self.graphs.run(self.stack, rows) if self.graphs is not None else None
        if graphed is not None:
            hidden, new_keys, new_values = graphed
        else:
            inputs = self.stack.prepare(rows, PassShape.of(rows), filter_padding=True)
            hidden, new_keys, new_values = self.stack.forward(rows, inputs)
        return self._outputs(rows, hidden, new_keys, new_values, prompt_lengths)

    def warm_up(self, *, prefix: int = 224, new: int = 192, max_batch: int = 64) -> None:
        """Compile and capture the common shapes before the first request does (a cached prefix, canvas rows).

        Random token ids; nothing is cached. Batches of 1, 2, 4, ... `max_batch`
        rows: after two sizes the compiled bodies take any batch, and each
        graph bucket is captured once.
        """
        generator = torch.Generator().manual_seed(0)
        vocab = int(self.stack.embed.weight.shape[0])

        def ids(count: int) -> list[int]:
            return torch.randint(3, vocab, (count,), generator=generator).tolist()

        [encoded] = self.run([Row(None, ids(prefix), (), (), (), keep_kv=True)])
        batch = 1
        while batch <= max_batch:
            rows = [Row(encoded.kv, ids(new - 32), ids(32), (0,), ((5, 6),)) for _ in range(batch)]
            self.run(rows)
            batch *= 2

    def image_token_count(self, image: ImageAsset) -> int:
        """How many soft tokens the vision tower writes for this image (its size decides)."""
        return int(self._process([image.data])["num_soft_tokens_per_image"][0])

    @torch.inference_mode()
    def image_features(self, images: Sequence[bytes]) -> list[torch.Tensor]:
        """The vision tower's output for each image, one [soft tokens, hidden] tensor each."""
        processed = self._process(images)
        device = self.stack.device
        encoder = self.model.model.encoder
        dtype = self.stack.embed.weight.dtype
        output = encoder.get_image_features(
            processed["pixel_values"].to(device, dtype), processed["image_position_ids"].to(device)
        )
        counts = [int(n) for n in processed["num_soft_tokens_per_image"]]
        return list(torch.split(output.pooler_output, counts))

    def _process(self, images: Sequence[bytes]) -> Any:
        if self.image_processor is None:
            raise ValueError("this checkpoint has no image processor")
        from PIL import Image

        pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        return self.image_processor(images=pictures, return_tensors="pt")

    def _outputs(
        self,
        rows: Sequence[Row],
        hidden: torch.Tensor,
        new_keys: list[torch.Tensor],
        new_values: list[torch.Tensor],
        prompt_lengths: list[int],
    ) -> list[RowOutput]:
        slot_rows = [b for b, row in enumerate(rows) for _ in row.slot_positions]
        slot_columns = [prompt_lengths[b] + p for b, row in enumerate(rows) for p in row.slot_positions]
        logprobs: list[torch.Tensor] = []
        if slot_rows:
            full = torch.log_softmax(self.logits(self.norm(hidden[slot_rows, slot_columns])), dim=-1)
            wanted = [ids for row in rows for ids in row.label_ids]
            width = max(len(ids) for ids in wanted)
            index = torch.tensor([[*ids, *([ids[0]] * (width - len(ids)))] for ids in wanted], device=full.device)
            gathered = full.gather(1, index).cpu()
            logprobs = [gathered[i, : len(ids)] for i, ids in enumerate(wanted)]
        outputs = []
        cursor = 0
        for b, row in enumerate(rows):
            count = len(row.slot_positions)
            kv = self._kept_kv(row, b, new_keys, new_values, prompt_lengths[b]) if row.keep_kv else None
            start = prompt_lengths[b]
            canvas = self.norm(hidden[b, start : start + len(row.canvas_ids)]) if row.canvas_hidden else None
            outputs.append(RowOutput(logprobs[cursor : cursor + count], kv, canvas))
            cursor += count
        return outputs

    @torch.inference_mode()
    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head over final (normed) hidden states, in fp32 and soft-capped, as the model's forward."""
        logits: torch.Tensor = self.lm_head(normed).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @staticmethod
    def _kept_kv(
        row: Row, b: int, new_keys: list[torch.Tensor], new_values: list[torch.Tensor], prompt_length: int
    ) -> PromptKV:
        keys, values = [], []
        for index in range(len(new_keys)):
            fresh_keys = new_keys[index][b, :, :prompt_length]
            fresh_values = new_values[index][b, :, :prompt_length]
            if row.past is not None:
                fresh_keys = torch.cat([row.past.keys[index], fresh_keys], dim=1)
                fresh_values = torch.cat([row.past.values[index], fresh_values], dim=1)
            keys.append(fresh_keys.clone())
            values.append(fresh_values.clone())
        past_length = row.past.length if row.past is not None else 0
        return PromptKV(keys, values, past_length + prompt_length)
