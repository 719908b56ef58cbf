"""What the vLLM stand-in (`vllm_standin.py`) takes from vLLM 0.33 itself: the request fields a canvas read and
a thought send, with vLLM's types and limits, its messages, and what it does to logprobs and sampling defaults."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field

# vLLM's `MAX_LOGPROB_TOKEN_IDS` (vllm/sampling_params.py).
MAX_LOGPROB_TOKEN_IDS = 128
# vLLM clamps -inf logprobs to this so they stay JSON numbers.
LOGPROB_FLOOR = -9999.0
# The sampling fields vLLM takes from generation_config.json when a request leaves them out, with its own defaults.
SAMPLING_DEFAULTS: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
# vLLM's `_SAMPLING_EPS`.
SAMPLING_EPS = 1e-5
BUSY_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
)
DIFFUSION_SAMPLING_MESSAGE = (
    "The temperature, min_p, seed, min_tokens, logit_bias, bad_words, and allowed_token_ids sampling parameters "
    "are not yet supported with diffusion models."
)

NonNegative = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]


class DiffusionXargs(BaseModel):
    """The `vllm_xargs` of a read-only diffusion step, typed as vLLM's `validate_diffusion_sampling_params` wants."""

    model_config = ConfigDict(extra="forbid", strict=True)

    diffusion_seed_canvas: list[NonNegative]
    diffusion_canvas_length: Positive | None = None
    diffusion_max_steps: Positive
    diffusion_read_only: bool
    diffusion_pinned: list[int] | None = None


class SampledRequest(BaseModel):
    """The fields of vLLM's `CompletionRequest` that both a canvas read and a thought send, with vLLM's types."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    prompt: Annotated[list[NonNegative], Field(min_length=1)]
    max_tokens: Positive
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None


class CompletionRequest(SampledRequest):
    """A canvas read: read-only logprobs of the label ids, and the diffusion keys."""

    logprobs: NonNegative | None = None
    logprob_token_ids: Annotated[list[int], Field(min_length=1)] | None = None
    return_tokens_as_token_ids: bool | None = None
    vllm_xargs: DiffusionXargs


class GenerationRequest(SampledRequest):
    """A thought: an ordinary diffusion generation."""

    stop_token_ids: list[NonNegative] | None = None
    return_token_ids: bool | None = None


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's top-k then top-p filter: tokens outside become −inf, before the read-only logprobs are taken."""
    if 0 < top_k < logits.shape[-1]:
        threshold = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < threshold, -math.inf)
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def logprob_key(token: int) -> str:
    """How vLLM names a token in `top_logprobs` when asked for token ids."""
    return f"token_id:{token}"


def clamp_logprob(value: float) -> float:
    """A logprob as vLLM reports it: -inf (and any non-finite value) at its floor, so it stays a JSON number."""
    return max(value, LOGPROB_FLOOR) if math.isfinite(value) else LOGPROB_FLOOR


def generation_defaults(folder: Path) -> dict[str, float]:
    """The sampling fields of the checkpoint's generation_config.json, as vLLM's `--generation-config auto` reads."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    return {name: config[name] for name in SAMPLING_DEFAULTS if config.get(name) is not None}


def raw_read(**change: Any) -> dict[str, Any]:
    """A minimal read-only completion, as a client that leaves sampling to vLLM's defaults would send it."""
    body: dict[str, Any] = {
        "model": "dgemma",
        "prompt": [2, 105, 2364],
        "max_tokens": 16,
        "logprobs": 3,
        "logprob_token_ids": [4443, 1294, 236743],
        "return_tokens_as_token_ids": True,
        "vllm_xargs": {
            "diffusion_seed_canvas": [0] * 16,
            "diffusion_canvas_length": 16,
            "diffusion_max_steps": 1,
            "diffusion_read_only": True,
        },
    }
    return {**body, **change}
