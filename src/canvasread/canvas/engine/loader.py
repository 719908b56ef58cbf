"""Loading a DiffusionGemma checkpoint (local folder or hub id) onto the best device the machine has."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from canvasread.canvas.engine.settings import torch_dtype_name
from canvasread.canvas.engine.weights import build_random
from canvasread.canvas.tokenizer import pretrained
from canvasread.errors import MissingExtra
from canvasread.types import ImageAsset


@dataclass(frozen=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    fingerprint: str
    image_processor: Any = None


_LoadKey = tuple[str, str | None, str | None, str | None, float | None]


def resolve_device(device: str | None) -> torch.device:
    """CUDA when present, else CPU; an explicit choice wins, when this machine has it."""
    if device:
        return present_device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def present_device(device: str) -> torch.device:
    """`device` as torch reads it; refused (ValueError) when torch cannot read it or counts fewer devices of its kind
    on this machine (`cuda` without CUDA, `cuda:1` beside one GPU, `mps` off a Mac), as nothing could load there.

    Kinds torch keeps no count of (and the CPU, whatever its index) are left to the load.
    """
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device {device!r}: {error}") from None
    counter = getattr(getattr(torch, parsed.type, None), "device_count", None)
    if parsed.type != "cpu" and counter is not None and (parsed.index or 0) >= (count := int(counter())):
        raise ValueError(f"no device {device!r} on this machine: torch counts {count} {parsed.type} device(s)")
    return parsed


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bf16 on GPUs, fp32 on CPUs (CPU bf16 matmuls are slow and lossy)."""
    if dtype:
        resolved: torch.dtype = getattr(torch, torch_dtype_name(dtype))
        return resolved
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
    real checkpoint. Loads are shared while something holds the model, so
    several backends (a naive baseline beside the fused engine) serve one
    instance, and a model nobody holds any more is freed.
    """
    return _LOADS.get((name_or_path, device, dtype, experts, random_init_std))


class _SharedLoads:
    """Loads by arguments, held weakly through their model; one lock per key, so replicas load in parallel."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a weakref callback may run during a collection under it
        self._key_locks: dict[_LoadKey, threading.Lock] = {}
        self._loaded: dict[_LoadKey, tuple[weakref.ref[Any], LoadedModel]] = {}

    def get(self, key: _LoadKey) -> LoadedModel:
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                held = self._loaded.get(key)
            model = held[0]() if held is not None else None
            if held is not None and model is not None:
                return replace(held[1], model=model)
            loaded = _load(*key)
            # The cache keeps the small parts only; the model's own lifetime decides the entry's.
            with self._lock:
                self._loaded[key] = (
                    weakref.ref(loaded.model, lambda _: self._forget(key)),
                    replace(loaded, model=None),
                )
            return loaded

    def _forget(self, key: _LoadKey) -> None:
        with self._lock:
            held = self._loaded.get(key)
            if held is not None and held[0]() is None:
                del self._loaded[key]


_LOADS = _SharedLoads()


def _load(
    name_or_path: str, device: str | None, dtype: str | None, experts: str | None, random_init_std: float | None
) -> LoadedModel:
    try:
        from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    except ImportError as error:
        raise MissingExtra(
            f"DiffusionGemma needs transformers >= 5.24: pip install 'canvasread[diffusion]' ({error})"
        ) from None
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    model: Any
    if random_init_std is None:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(name_or_path, dtype=torch_dtype)
        model = model.to(target)
    else:
        config = DiffusionGemmaConfig.from_pretrained(name_or_path)
        model = build_random(
            DiffusionGemmaForBlockDiffusion, config, device=target, dtype=torch_dtype, std=random_init_std
        )
    if experts:
        model.set_experts_implementation(experts)
    model = model.eval()
    tokenizer = pretrained(name_or_path)
    processor = image_processor(name_or_path)
    stamp = fingerprint(name_or_path, model) + ("" if random_init_std is None else f"-random{random_init_std:g}")
    return LoadedModel(model, tokenizer, stamp, processor)


@dataclass(frozen=True)
class Companions:
    """What the server needs of a checkpoint whose model runs in another process: its config, tokenizer and
    image processor (None for a text-only checkpoint)."""

    config: Any
    tokenizer: Any
    image_processor: Any = None


def load_companions(name_or_path: str) -> Companions:
    from transformers import DiffusionGemmaConfig

    config = DiffusionGemmaConfig.from_pretrained(name_or_path)
    return Companions(config, pretrained(name_or_path), image_processor(name_or_path))


def process_images(processor: Any, images: Sequence[bytes]) -> Any:
    """The checkpoint's image processor over encoded images (PNG or JPEG bytes), as tensors."""
    if processor is None:
        raise ValueError("this checkpoint has no image processor")
    from PIL import Image

    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    return processor(images=pictures, return_tensors="pt")


def soft_token_count(processor: Any, image: ImageAsset) -> int:
    """How many soft tokens the vision tower writes for this image (its size decides)."""
    return int(process_images(processor, [image.data])["num_soft_tokens_per_image"][0])


def image_processor(name_or_path: str) -> Any:
    """The checkpoint's image processor (Pillow backend, no torchvision), or None for a text-only checkpoint."""
    from transformers import AutoImageProcessor

    processors: Any = AutoImageProcessor  # typed from transformers 5.25 on, untyped before
    try:
        return processors.from_pretrained(name_or_path, backend="pil")
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
