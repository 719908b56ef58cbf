"""A thought as the engine writes it: transformers' block-diffusion `generate`, one denoising pass at a time.

`generate` writes a canvas (block) of `canvas_length` tokens at a time: a
canvas of uniform noise is denoised for the checkpoint's `steps`
(`sampling.draw`, self-conditioned on the previous step), stopping early
once the argmax canvas is stable and confident (its adaptive stop); the last
step's argmax canvas is the block. The generation ends after a block that
holds a stop id or that brings it to `max_tokens`; otherwise the block is
encoded after the prompt (causally, as the prompt was) and the next block
starts from fresh noise. `Generation` is that loop turned inside out: the
engine asks it for the rows of its next pass (the last block's encoding, if
any, and the canvas being denoised, which may share one pass: the store is
written before attention reads it) and hands it the canvas logits back. All
draws come from one generator seeded with the request's seed, in the order
`generate` draws them from torch's, so a thought is `generate`'s token for
token.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from canvasread.canvas.engine.sampling import Scaled, Schedule, draw, noise_canvas, soft_embeddings
from canvasread.canvas.thinker import Thought, ThoughtRequest, thought_prefix


class Generation:
    """One thought being written: the blocks so far, the block being denoised, the adaptive stop's history."""

    def __init__(
        self, request: ThoughtRequest, schedule: Schedule, *, canvas_length: int, vocab: int, device: torch.device
    ) -> None:
        self.request = request
        self.schedule = schedule
        self.width = canvas_length
        self.vocab = vocab
        self.started = time.monotonic()
        self.generator = torch.Generator(device=device).manual_seed(request.seed)
        self.written: list[int] = []  # every block so far, as generate appends them
        self.encoded = 0  # blocks whose keys are in the store
        self.signal: torch.Tensor | None = None
        self.thought: Thought | None = None
        self._history: deque[torch.Tensor] = deque(maxlen=max(1, schedule.stability or 1))
        self._remaining = 0
        self.canvas = self._fresh_block()

    @property
    def blocks(self) -> int:
        """The most blocks this thought can take (generate's `max_new_canvases`)."""
        return -(-self.request.max_tokens // self.width)

    @property
    def pending_block(self) -> list[int] | None:
        """The last block's tokens while they still have to be encoded before the next block's first step."""
        if self.encoded * self.width == len(self.written):
            return None
        return self.written[self.encoded * self.width :]

    def canvas_ids(self) -> list[int]:
        return [int(token) for token in self.canvas.tolist()]

    @property
    def temperature(self) -> float:
        """The temperature of the step after the next pass."""
        return self.schedule.temperature(self._remaining, self.schedule.steps)

    @torch.inference_mode()
    def advance(self, scaled: Scaled, embed: Any) -> None:
        """Take the denoising step after a pass whose canvas logits, at `temperature`, are `scaled`; the next
        pass's self-conditioning only where the block goes on (a new block starts without)."""
        step = draw(scaled, self.schedule.entropy_bound, self.generator)
        self._remaining -= 1
        stopped = self.stops(step.argmax, step.entropy)
        if stopped or self._remaining == 0:
            self._end_block([int(token) for token in step.argmax.tolist()])
        else:
            self.canvas, self.signal = step.canvas, soft_embeddings(step.mixture, embed)

    def stops(self, argmax: torch.Tensor, entropy: torch.Tensor) -> bool:
        """generate's adaptive stop: the argmax canvas equals the last `stability` ones, and its mean entropy is
        under `confidence` (no stop when the checkpoint sets neither)."""
        stability, confidence = self.schedule.stability, self.schedule.confidence
        if stability is None or confidence is None:
            return False
        history = self._history
        stable = stability == 0 or (
            len(history) == stability and all(bool(torch.equal(seen, argmax)) for seen in history)
        )
        if stability:
            history.append(argmax)
        return stable and bool(entropy.mean() < confidence)

    def _end_block(self, block: list[int]) -> None:
        """Append the block; end the thought (a stop id, or `max_tokens` written), else start the next block."""
        self.written += block
        request = self.request
        if any(token in request.stop_ids for token in block) or len(self.written) >= request.max_tokens:
            ms = (time.monotonic() - self.started) * 1000.0
            self.thought = thought_prefix(request, self.written, ms)
            return
        self.canvas = self._fresh_block()

    def _fresh_block(self) -> torch.Tensor:
        self._remaining = self.schedule.steps
        self.signal = None
        self._history.clear()
        return noise_canvas(self.width, self.vocab, self.generator)
