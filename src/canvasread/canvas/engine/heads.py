"""The LM head where a read needs it: label log-probabilities at slots, full logits for denoising steps.

A slot's answer needs its label ids' log-probabilities, whose normaliser is a
log-sum-exp over the whole vocabulary (262k columns on the real model). The
head runs over slots in chunks of at most `CHUNK_ELEMENTS` logits, so a pass
of thousands of slots never holds a [slots, vocab] tensor, and only the
label columns leave the device. A denoising step needs the whole
distribution instead (`scaled`): on a GPU its arithmetic is compiled into a
few fused passes over the head's output, built at warm-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from canvasread.canvas.engine.sampling import Scaled, scale, softcapped

logger = logging.getLogger(__name__)

# The canvas width the compiled step is first built at; its width is then dynamic (2 and up).
WARM_CANVAS = 8
# fp32 logits one chunk of slots may hold: 64 MB, 64 slots of the real vocabulary.
CHUNK_ELEMENTS = 1 << 24


class SlotHead:
    """The final norm, LM head and soft-cap of a loaded `DiffusionGemmaForBlockDiffusion`."""

    def __init__(self, model: Any, *, compile: str | None = None) -> None:
        """`compile`: a `torch.compile` backend for a denoising step's arithmetic (`scaled`)."""
        self.norm = model.model.encoder.language_model.norm
        self.lm_head = model.lm_head
        self.softcap = float(model.config.text_config.final_logit_softcapping or 0.0)
        self.compiled = bool(compile)
        # generate self-conditions on the softmax of the logits rounded to the embedding's dtype; inside a fused
        # kernel Inductor would skip that rounding unless told to keep it.
        options: dict[str, str | int | bool | Callable[..., Any]] | None = None
        if compile == "inductor":
            options = {"emulate_precision_casts": True}
        self._scale = torch.compile(scale, backend=compile, options=options) if compile else scale

    @property
    def vocab(self) -> int:
        return int(self.lm_head.weight.shape[0])

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head over final (normed) hidden states, in fp32 and soft-capped, as the model's forward."""
        return softcapped(self.lm_head(normed), self.softcap)

    def scaled(self, normed: torch.Tensor, temperature: float) -> Scaled:
        """A denoising step's view of a canvas's logits (its normed final hidden states) at `temperature`. The
        temperature goes in as a tensor written on the device, so a compiled step neither specializes on it nor
        waits for a copy."""
        head = self.lm_head
        on_device = torch.full((), temperature, dtype=torch.float32, device=normed.device)
        return Scaled(*self._scale(normed, head.weight, head.bias, on_device, self.softcap))

    def warm_up(self) -> None:
        """Build the compiled step once for canvases of every width (their size dynamic), before the first
        request. A build that fails leaves the step eager, with a warning: eager is exact, only slower, as a
        capture that fails leaves its bucket to the pieces."""
        if not self.compiled:
            return
        weight = self.lm_head.weight
        normed = torch.zeros(WARM_CANVAS, weight.shape[1], dtype=weight.dtype, device=weight.device)
        torch._dynamo.mark_dynamic(normed, 0)
        try:
            self.scaled(normed, 1.0)
        except Exception as error:  # any compiler failure: the eager step computes the same thing
            logger.warning("the denoising step's arithmetic did not compile; it runs eagerly: %r", error)
            self._scale, self.compiled = scale, False

    def label_logprobs(self, hidden: torch.Tensor, label_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per slot (a row of `hidden`, before the norm): the log-probabilities of its label ids, on the CPU."""
        if not label_ids:
            return []
        width = max(len(ids) for ids in label_ids)
        index = torch.tensor([[*ids, *([ids[0]] * (width - len(ids)))] for ids in label_ids], device=hidden.device)
        step = max(1, CHUNK_ELEMENTS // self.vocab)
        parts = []
        for start in range(0, hidden.shape[0], step):
            logits = self.logits(self.norm(hidden[start : start + step]))
            chosen = logits.gather(1, index[start : start + step])
            parts.append(chosen - torch.logsumexp(logits, dim=-1, keepdim=True))
        gathered = torch.cat(parts).cpu()
        return [gathered[i, : len(ids)] for i, ids in enumerate(label_ids)]
