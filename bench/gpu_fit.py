"""Whether `--random-weights` builds the full model on this GPU, and the memory it takes.

Usage (on a GPU machine, after `source bench/gpu_setup.sh`): python3 bench/gpu_fit.py MODEL_FOLDER OUT.json

Builds the checkpoint folder's config with random weights through the loader,
as `canvasread serve --random-weights 0.02` does, and reports the build's
time, the memory allocated after it and at its peak (torch's allocator), the
GPU's total, and the parameters held. Before the build allocated each
parameter once after tying, the 26B-A4B shape's peak was 103 GB, over an
80 GB H100 (`bench/results/h100-2026-12-05`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from canvasread.canvas.engine.loader import load_checkpoint

GIB = 2**30


def main(folder: str, out: Path) -> None:
    started = time.perf_counter()
    loaded = load_checkpoint(folder, random_init_std=0.02, experts="grouped_mm")
    torch.cuda.synchronize()
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "build_s": time.perf_counter() - started,
        "allocated_gib": torch.cuda.memory_allocated() / GIB,
        "peak_gib": torch.cuda.max_memory_allocated() / GIB,
        "total_gib": torch.cuda.get_device_properties(0).total_memory / GIB,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
    }
    print(json.dumps(report), flush=True)
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
