"""Loading a DiffusionGemma checkpoint (local folder or hub id) onto the best device the machine has."""

from __future__ import annotations

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
    device: torch.device
    dtype: torch.dtype
    fingerprint: str


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
    name_or_path: str, *, device: str | None = None, dtype: str | None = None, experts: str | None = None
) -> LoadedModel:
    """`from_pretrained` for model and tokenizer: local folders directly, hub ids through the normal cache."""
    try:
        from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion
    except ImportError as error:
        raise MissingExtra(
            f"DiffusionGemma needs transformers >= 5.22: pip install 'canvasread[diffusion]' ({error})"
        ) from None
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    options: dict[str, Any] = {"dtype": torch_dtype}
    if experts:
        options["experts_implementation"] = experts
    model: Any = DiffusionGemmaForBlockDiffusion.from_pretrained(name_or_path, **options)
    model = model.to(target).eval()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return LoadedModel(model, tokenizer, target, torch_dtype, fingerprint(name_or_path, model))


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
