"""The naive baseline's `Thinker`: transformers' own DiffusionGemma `generate` on the loaded model, seeded.

A thought is what the model's generation loop writes (the checkpoint's
`generation_config.json` sets the denoising steps, temperature schedule and
sampler). It costs one denoising loop per canvas of tokens on the batch
worker, while reads of other requests wait; thoughts of one batch are written
one after another. The fused engine writes the same thoughts in its own
passes (`reader.EngineThinker`, `generation.py`); this is what it is held to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from canvasread.backends.base import Gone, never_gone
from canvasread.canvas.engine.loader import process_images
from canvasread.canvas.thinker import Thought, ThoughtRequest, thought_prefix

# torch's default generators are process-wide: a seeded generation forks them under this lock, so two replicas
# (or a replica and a test's stand-in) never draw from each other's seeded stream.
_SEEDED = threading.Lock()


class GenerateThinker:
    """Writes thoughts with `model.generate`; one instance per model replica, used from its worker thread."""

    def __init__(self, model: Any, *, pad_id: int, image_processor: Any = None) -> None:
        self.model = model
        self.pad_id = pad_id
        self.image_processor = image_processor
        self.thoughts = 0

    def think(self, requests: Sequence[ThoughtRequest], gone: Gone = never_gone) -> list[Thought | None]:
        return [None if gone(i) else self._think(request) for i, request in enumerate(requests)]

    def _think(self, request: ThoughtRequest) -> Thought:
        started = time.monotonic()
        device = next(self.model.parameters()).device
        forked = [device.index or 0] if device.type == "cuda" else []
        prompt = torch.tensor([request.prompt_ids], device=device)
        images = self._image_inputs(request, prompt)
        with _SEEDED, torch.random.fork_rng(devices=forked), torch.no_grad():
            torch.manual_seed(request.seed)
            output = self.model.generate(
                prompt,
                max_new_tokens=request.max_tokens,
                eos_token_id=list(request.stop_ids),
                pad_token_id=self.pad_id,
                disable_compile=True,  # a thought's shapes vary; compiling them would stall the worker
                **images,
            )
        written = output.sequences[0, prompt.shape[1] :].tolist()
        self.thoughts += 1
        return thought_prefix(request, written, (time.monotonic() - started) * 1000.0)

    def _image_inputs(self, request: ThoughtRequest, prompt: torch.Tensor) -> dict[str, torch.Tensor]:
        """What `generate` takes for the prompt's images: the processor's pixels and which tokens are soft."""
        if not request.images:
            return {}
        processed = process_images(self.image_processor, [image.data for image in request.images])
        soft = torch.zeros_like(prompt)
        for image in request.images:
            soft[0, image.start : image.start + image.tokens] = 1
        dtype = next(self.model.parameters()).dtype
        return {
            "pixel_values": processed["pixel_values"].to(prompt.device, dtype),
            "image_position_ids": processed["image_position_ids"].to(prompt.device),
            "mm_token_type_ids": soft,
        }
