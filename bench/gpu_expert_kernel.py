"""The routed experts' products: the Triton kernel's tiles against CUTLASS's grouped GEMM, by pass size.

Usage (on a GPU machine, after `source bench/gpu_setup.sh`): python3 bench/gpu_expert_kernel.py OUT.json

On one layer of DiffusionGemma-26B-A4B's experts (128 experts; gate and up
2 x 704 x 2,816, down 2,816 x 704; random bf16 weights, 1.5 GB, more than
the L2 holds, so every call streams them), for passes of 16 to 8,192 tokens
routed to 8 random experts each:

1. every tile in TILES (row-major and swapped) on a 16-token pass (a later
   denoising step's canvas), a 172-token pass (a lone `standard` read) and a
   1,024-token pass, for each of the two products;
2. the best two at each of those, and the grouped GEMM, at every pass size: GPU ms
   (CUDA events, median of 15 after 3 warm-ups) and the weight bytes of the
   experts used, per second;
3. the kernel's largest difference from the grouped GEMM, relative to the
   output's largest magnitude (both accumulate in fp32 and round to bf16);
4. the same for the FP8 launch against `torch._scaled_grouped_mm`.

`expert_kernel.CANDIDATES` is picked from its output. Which pass sizes take
the kernel, and with which of those tiles, the engine times for itself at
start-up (`expert_choice.py`).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from functools import partial
from pathlib import Path

import torch
from expert_sum import median_ms

from canvasread.canvas.engine.expert_kernel import Tiles, expert_rows
from canvasread.canvas.engine.experts import Fp8Weight, quantize_rows

EXPERTS, TOP_K, WIDTH, EXPERT_WIDTH = 128, 8, 2816, 704
TOKENS = [16, 64, 172, 256, 512, 1024, 2048, 4096, 8192]
# A later denoising step's canvas, a lone `standard` read, a batch of them.
SWEEP_TOKENS = [16, 172, 1024]
TILES = [
    Tiles(m, n, k, warps, stages)
    for m, n, k in itertools.product((16, 64), (32, 64), (128, 256))
    for warps, stages in ((4, 4), (4, 5), (8, 4))
] + [
    Tiles(m, n, k, warps, stages, swapped=True)
    for m, n, k in itertools.product((16, 32), (64, 128), (64, 128))
    for warps, stages in ((4, 3), (4, 4), (8, 4))
]
FINALISTS = 2  # the best tiles at each sweep size
CUDA = torch.device("cuda")


def grouped(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)


def scaled_grouped(
    values: torch.Tensor, scales: torch.Tensor, weight: Fp8Weight, offsets: torch.Tensor
) -> torch.Tensor:
    return torch._scaled_grouped_mm(
        values,
        weight.values.transpose(-2, -1),
        scales,
        weight.scales,
        offs=offsets,
        out_dtype=torch.bfloat16,
        use_fast_accum=True,
    )


def scaled_kernel(
    values: torch.Tensor, scales: torch.Tensor, weight: Fp8Weight, offsets: torch.Tensor, tiles: Tiles
) -> torch.Tensor:
    return expert_rows(values, weight.values, offsets, tiles, scales=(scales, weight.scales), dtype=torch.bfloat16)


def fp8_sizes(weights: dict[str, torch.Tensor], ranked: dict[str, list[Tiles]]) -> dict[str, dict]:
    """The FP8 launch against `torch._scaled_grouped_mm` (fast accumulation, as the engine runs it)."""
    results = {}
    for product, weight in weights.items():
        quantized = Fp8Weight.of(weight)
        candidates = [*ranked[product][:2], Tiles(16, 64, 256, 4, 3), Tiles(16, 128, 256, 4, 3)]
        for tokens in TOKENS:
            offsets, used = routed(tokens)
            values, scales = quantize_rows(torch.randn(tokens * TOP_K, weight.shape[2], device="cuda"))
            used_bytes = used * weight[0].numel()
            expected = scaled_grouped(values, scales, quantized, offsets).float()
            base = median_ms(partial(scaled_grouped, values, scales, quantized, offsets), CUDA)
            entry: dict[str, object] = {"scaled_grouped": {"ms": base, "tb_per_s": used_bytes / base / 1e9}}
            for tiles in dict.fromkeys(candidates):
                try:
                    ms = median_ms(partial(scaled_kernel, values, scales, quantized, offsets, tiles), CUDA)
                except Exception as failure:  # a tile too large for the shared memory, say
                    entry[str(tiles)] = {"failed": str(failure)[:200]}
                    continue
                error = (scaled_kernel(values, scales, quantized, offsets, tiles).float() - expected).abs().max()
                entry[str(tiles)] = {
                    "ms": ms,
                    "tb_per_s": used_bytes / ms / 1e9,
                    "relative_error": float(error / expected.abs().max()),
                }
            results[f"{product}/{tokens}"] = entry
            print("fp8", product, tokens, json.dumps(entry), flush=True)
    return results


def routed(tokens: int) -> tuple[torch.Tensor, int]:
    """Where each expert's rows end for `tokens` tokens routed to TOP_K distinct random experts, and how many
    experts got any."""
    chosen = torch.rand(tokens, EXPERTS, device="cuda").topk(TOP_K, dim=-1).indices.reshape(-1)
    counts = torch.bincount(chosen, minlength=EXPERTS)
    return counts.cumsum(0).to(torch.int32), int((counts > 0).sum())


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    weights = {
        "gate_up": torch.randn(EXPERTS, 2 * EXPERT_WIDTH, WIDTH, device="cuda", dtype=torch.bfloat16) * 0.02,
        "down": torch.randn(EXPERTS, WIDTH, EXPERT_WIDTH, device="cuda", dtype=torch.bfloat16) * 0.02,
    }
    results: dict[str, dict] = {"device": {"name": torch.cuda.get_device_name()}, "sweep": {}, "sizes": {}}
    ranked: dict[str, list[Tiles]] = {}
    for product, weight in weights.items():
        ranked[product] = []
        for tokens in SWEEP_TOKENS:
            scores: dict[Tiles, float] = {}  # each tile's time over the grouped GEMM's at this size (inf: failed)
            offsets, _ = routed(tokens)
            rows = torch.randn(tokens * TOP_K, weight.shape[2], device="cuda", dtype=torch.bfloat16)
            base = median_ms(partial(grouped, rows, weight, offsets), CUDA)
            for tiles in TILES:
                try:
                    ms = median_ms(partial(expert_rows, rows, weight, offsets, tiles), CUDA)
                except Exception as error:  # a tile too large for the shared memory, say
                    scores[tiles] = math.inf
                    results["sweep"][f"{product}/{tokens}/{tiles}"] = {"failed": str(error)[:200]}
                    continue
                scores[tiles] = ms / base
                results["sweep"][f"{product}/{tokens}/{tiles}"] = {"kernel_ms": ms, "grouped_ms": base}
            best = sorted(TILES, key=scores.__getitem__)[:FINALISTS]
            ranked[product] += [tiles for tiles in best if tiles not in ranked[product]]
            print(product, tokens, "grouped", round(base, 3), "best", [(t, round(scores[t], 3)) for t in best])
    for tokens in TOKENS:
        offsets, used = routed(tokens)
        for product, weight in weights.items():
            rows = torch.randn(tokens * TOP_K, weight.shape[2], device="cuda", dtype=torch.bfloat16)
            used_bytes = used * weight[0].numel() * weight.element_size()
            expected = grouped(rows, weight, offsets).float()
            entry: dict[str, object] = {"experts_used": used}
            base = median_ms(partial(grouped, rows, weight, offsets), CUDA)
            entry["grouped"] = {"ms": base, "tb_per_s": used_bytes / base / 1e9}
            for tiles in ranked[product]:
                ms = median_ms(partial(expert_rows, rows, weight, offsets, tiles), CUDA)
                error = (expert_rows(rows, weight, offsets, tiles).float() - expected).abs().max()
                entry[str(tiles)] = {
                    "ms": ms,
                    "tb_per_s": used_bytes / ms / 1e9,
                    "relative_error": float(error / expected.abs().max()),
                }
            results["sizes"][f"{product}/{tokens}"] = entry
            print(product, tokens, json.dumps(entry), flush=True)
    results["finalists"] = {product: [str(tiles) for tiles in tiles_] for product, tiles_ in ranked.items()}
    out.write_text(json.dumps(results, indent=2) + "\n")
    results["fp8"] = fp8_sizes(weights, ranked)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
