"""Which SDPA kernel should a pass's attention groups use: time each on the shapes the engine's groups take.

Usage (on a GPU machine): python3 bench/gpu_attention_kernels.py OUT.json

The engine folds grouped-query heads into the query axis and passes an
additive mask (`layout.py`), so each kernel is timed on that layout, in bf16,
on DiffusionGemma-26B-A4B's two layer kinds (sliding: 8 key heads of 256,
fold 2; full: 2 key heads of 512, fold 8) and on group shapes a server sees:
many short canvas rows, a batch of ~170-token prompts, one long prompt.
For each: GPU ms per call (CUDA events, median of 20 after 3 warm-ups) and
host ms per call (the launch, where a kernel plans per shape), or why the
kernel refused the shape.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KINDS = {"sliding": (8, 2, 256), "full": (2, 8, 512)}  # key heads, fold, head dim
SHAPES = {"canvases": (64, 48, 400), "prompts": (32, 176, 336), "long_prompt": (1, 2000, 2016)}  # rows, new, keys
BACKENDS = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def timed(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> dict:
    def call() -> torch.Tensor:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)

    try:
        for _ in range(3):
            call()
    except RuntimeError as error:
        return {"refused": str(error).splitlines()[0][:200]}
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        start.record()
        call()
        end.record()
        host.append((time.perf_counter() - started) * 1000.0)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    return {"gpu_ms": statistics.median(gpu), "host_ms": statistics.median(host)}


def main() -> None:
    out = Path(sys.argv[1])
    results: dict[str, dict] = {}
    for kind, (kv, fold, dim) in KINDS.items():
        for shape, (rows, new, keys) in SHAPES.items():
            q = torch.randn(rows, kv, fold * new, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(rows, kv, keys, dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(rows, kv, keys, dim, device="cuda", dtype=torch.bfloat16)
            allowed = torch.rand(rows, 1, new, keys, device="cuda") < 0.7
            allowed[..., 0] = True
            mask = torch.zeros(allowed.shape, dtype=torch.bfloat16, device="cuda").masked_fill_(~allowed, -torch.inf)
            mask = mask.repeat(1, 1, fold, 1)
            entry = {name: timed(backend, q, k, v, mask) for name, backend in BACKENDS.items()}
            results[f"{kind}/{shape}"] = entry
            print(kind, shape, json.dumps(entry), flush=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
