"""Loading a DiffusionGemma checkpoint (local folder or hub id) onto the best device the machine has."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from canvasread.errors import MissingExtra

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    fingerprint: str
    image_processor: Any = None


def resolve_device(device: str | None) -> torch.device:
    """CUDA when present, else CPU; an explicit choice wins."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bf16 on GPUs, fp32 on CPUs (CPU bf16 matmuls are slow and lossy)."""
    if dtype:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_checkpoint(
    name_or_path: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    experts: str | None = None,
    random_init_std: float | None = None,
) -> LoadedModel:
    """`from_pretrained` for model and tokenizer: local folders directly, hub ids through the normal cache.

    With `random_init_std` only the folder's config is read and the weights
    are drawn from N(0, std) on the device: full-size speed tests without the
    real checkpoint. Loads are shared, so several backends (a naive baseline
    beside the fused engine) can serve one model instance.
    """
    return _load(name_or_path, device, dtype, experts, random_init_std)


@functools.lru_cache(maxsize=8)
def _load(
    name_or_path: str, device: str | None, dtype: str | None, experts: str | None, random_init_std: float | None
) -> LoadedModel:
    try:
        from transformers import AutoTokenizer, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    except ImportError as error:
        raise MissingExtra(
            f"DiffusionGemma needs transformers >= 5.22: pip install 'canvasread[diffusion]' ({error})"
        ) from None
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    model: Any
    if random_init_std is None:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(name_or_path, dtype=torch_dtype)
        model = model.to(target)
    else:
        from canvasread.tools.checkpoints import initialise_weights

        config = DiffusionGemmaConfig.from_pretrained(name_or_path)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch_dtype)
        try:
            with torch.device(target):
                model = DiffusionGemmaForBlockDiffusion(config)
        finally:
            torch.set_default_dtype(previous)
        initialise_weights(model, std=random_init_std)
    if experts:
        model.set_experts_implementation(experts)
    model = model.eval()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    image_processor = _image_processor(name_or_path)
    stamp = fingerprint(name_or_path, model) + ("" if random_init_std is None else f"-random{random_init_std:g}")
    return LoadedModel(model, tokenizer, stamp, image_processor)


def _image_processor(name_or_path: str) -> Any:
    """The checkpoint's image processor (Pillow backend, no torchvision), or None for a text-only checkpoint."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(name_or_path, backend="pil")  # type: ignore[no-untyped-call]
    except (OSError, ValueError):
        return None


FINGERPRINT_SAMPLE_BYTES = 1 << 20


def fingerprint(name_or_path: str, model: Any) -> str:
    """A short hash of the config and of each weight file's size, header and first MiB of data.

    Cheap even for 50 GB of weights, yet it changes when the weights do, so a
    calibration fit for one checkpoint is not applied to another.
    """
    digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    folder = Path(name_or_path)
    if folder.is_dir():
        for path in sorted(folder.glob("*.safetensors")):
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
            with path.open("rb") as handle:
                digest.update(handle.read(FINGERPRINT_SAMPLE_BYTES))
    else:
        digest.update(name_or_path.encode())
    return digest.hexdigest()[:16]
