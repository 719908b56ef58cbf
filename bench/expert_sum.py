"""The routed experts' sum per token: gathered back (`experts.combined`) against the two ways it replaced.

Usage: python3 bench/expert_sum.py OUT.json [cuda|cpu]

At DiffusionGemma-26B-A4B's shape (width 2,816, 8 of 128 experts a token),
for passes of 172 to 4,096 tokens routed at random: the down products' rows
in expert order (bf16), summed into their tokens three ways, each compiled
with Inductor as the engine's `post` piece is (the token count dynamic).
The scatter-add is the engine's sum before stop 40: each row weighted in
fp32 and added into its token with `index_add_` (atomics on a GPU). The
reduction is the gathered sum before stop 42: `sum(dim=1)` over the top-k
axis, which Inductor compiles as a reduction. Reports the median ms of each
(CUDA events on a GPU, the wall clock on a CPU) and the largest difference
of `combined` from the others, which is rounding: all sum in fp32.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from canvasread.canvas.engine.experts import combined

EXPERTS, TOP_K, WIDTH = 128, 8, 2816
TOKENS = [172, 512, 1024, 4096]


def scattered(down: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The sum as the engine took it before: rows weighted, then added into their tokens."""
    tokens, top_k = top_k_weights.shape
    weighted = down.float() * top_k_weights.reshape(-1).index_select(0, order)[:, None]
    out = torch.zeros(tokens, down.shape[-1], device=down.device, dtype=torch.float32)
    return out.index_add_(0, order // top_k, weighted)


def reduced(down: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The gathered sum as a reduction over the top-k axis, as the engine took it before `combined` unrolled it."""
    tokens, top_k = top_k_weights.shape
    positions = torch.arange(order.shape[0], device=order.device, dtype=order.dtype)
    inverse = torch.empty_like(order).scatter_(0, order, positions)
    picked = down[inverse].view(tokens, top_k, down.shape[-1])
    return (picked.float() * top_k_weights.float()[..., None]).sum(dim=1)


def median_ms(call: Callable[[], torch.Tensor], device: torch.device) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(15):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            call()
            times.append((time.perf_counter() - began) * 1000.0)
    return statistics.median(times)


def main(out: Path, device: torch.device) -> None:
    generator = torch.Generator(device).manual_seed(0)
    ways = {
        name: torch.compile(way, dynamic=True)
        for name, way in (("gathered", combined), ("reduced", reduced), ("scattered", scattered))
    }
    rows = []
    for tokens in TOKENS:
        chosen = torch.rand(tokens, EXPERTS, device=device, generator=generator).topk(TOP_K).indices
        weights = torch.rand(tokens, TOP_K, device=device, generator=generator)
        _, order = torch.sort(chosen.reshape(-1))
        down = torch.randn(tokens * TOP_K, WIDTH, device=device, dtype=torch.bfloat16, generator=generator)
        sums = {name: way(down, order, weights) for name, way in ways.items()}
        row: dict[str, float] = {
            name: median_ms(partial(way, down, order, weights), device) for name, way in ways.items()
        }
        row.update(
            tokens=tokens,
            largest_difference=max(
                float((sums["gathered"] - sums[other]).abs().max()) for other in ("reduced", "scattered")
            ),
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    out.write_text(json.dumps({"device": str(device), "torch": torch.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu"))
