"""The naive reader: one plain transformers forward per canvas read, logits over the whole canvas.

This is what a straightforward implementation does (the encoder re-runs for
every canvas, the LM head runs at every canvas position, no batching). It is
served side by side with the fused engine by `canvasread serve
--naive-baseline` so benchmarks compare both on the same model instance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from canvasread.canvas.reader import CanvasRead, SlotLogProbs


class NaiveReader:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.forwards = 0

    def counters(self) -> Mapping[str, float]:
        return {"reads": float(self.forwards), "encoder_runs": float(self.forwards)}

    @torch.inference_mode()
    def read(self, reads: Sequence[CanvasRead]) -> list[list[SlotLogProbs]]:
        device = next(self.model.parameters()).device
        results = []
        for read in reads:
            if read.images:
                raise ValueError("the naive baseline reads text only")
            output = self.model(
                input_ids=torch.tensor([read.prompt_ids], device=device),
                decoder_input_ids=torch.tensor([read.canvas_ids], device=device),
            )
            logprobs = torch.log_softmax(output.logits[0].float(), dim=-1)
            results.append(
                [SlotLogProbs(tuple(logprobs[slot.position, list(slot.label_ids)].tolist())) for slot in read.slots]
            )
            self.forwards += 1
        return results
