"""`VllmSettings`: the vLLM wing's settings (the `serve --upstream…` and `--tokenizer` flags), and vLLM's dialect.

They extend the upstream settings every HTTP wing shares (`canvasread.upstream.settings`) with what reading a
canvas through vLLM needs, and build the wing's backend (`backends`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from canvasread.upstream.pool import Dialect, UpstreamModel
from canvasread.upstream.settings import UpstreamSettings

if TYPE_CHECKING:
    from canvasread.backends.base import AnyBackend
    from canvasread.canvas.backend import ReadSettings

# The canvas the documented vLLM recipe serves (`--diffusion-config '{"canvas_length": 64}'`): room for ~12
# answer lines per canvas, and a small self-conditioning buffer per sequence on the GPU.
DEFAULT_CANVAS_LENGTH = 64


def served_by_vllm(listing: Any, model: str) -> UpstreamModel | None:
    """`model` in vLLM's `/v1/models` (OpenAI's list: `data[].id`, with the checkpoint as `root` and its
    `max_model_len`), or None when it is not served."""
    for entry in listing.get("data", []) if isinstance(listing, dict) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            length = entry.get("max_model_len")
            return UpstreamModel(str(entry.get("root") or model), length if isinstance(length, int) else None)
    return None


# vLLM's `/health` and `/v1/models`; its admission control answers 503 when its queue is full.
VLLM = Dialect(served=served_by_vllm, key_flag="--upstream-api-key")


@dataclass(frozen=True, kw_only=True)
class VllmSettings(UpstreamSettings):
    """DiffusionGemma served by vLLM: where (the upstream settings), its tokenizer, the canvas it serves."""

    tokenizer: str
    canvas_length: int = DEFAULT_CANVAS_LENGTH
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tokenizer:
            raise ValueError("--upstream needs --tokenizer: the model's tokenizer folder or hub id")
        if self.canvas_length < 16:
            raise ValueError("--upstream-canvas-length must be at least 16 (vLLM's --diffusion-config canvas_length)")
        if self.max_model_len is not None and self.max_model_len <= self.canvas_length:
            raise ValueError("--upstream-max-model-len must exceed the canvas length")

    def backends(self, reading: ReadSettings) -> list[AnyBackend]:
        """The wing's one backend (`canvas.vllm.factory`): nothing is loaded or contacted until it loads."""
        from canvasread.canvas.vllm.factory import vllm_backend

        return [vllm_backend(self, reading)]
