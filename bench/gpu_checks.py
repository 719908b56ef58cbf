"""Two follow-up checks on a GPU machine: what the fp32 GPU difference comes from, and FP8 fast accumulation.

Usage: PYTHONPATH=src python3 bench/gpu_checks.py MODEL_FOLDER OUT.json

1. fp32, the full-width config cut to 4 layers: fused engine vs a plain forward, once with the engine's
   grouped experts and once with transformers' own experts module inside the fused pass (the reference's
   summation order). If only the first differs, the difference is routing near-ties, not the engine.
2. One layer's FP8 grouped experts at 11,520 tokens with and without `use_fast_accum`.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from gpu_profile import fp32_check

from canvasread.canvas.engine import experts, layers


def with_reference_experts(folder: str) -> float:
    def reference(module: Any, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, fp8: Any) -> Any:
        return module(hidden, index, weights)

    original = layers.routed_experts
    layers.routed_experts = reference  # type: ignore[assignment]
    try:
        return fp32_check(folder)
    finally:
        layers.routed_experts = original


def fast_accum(folder: str) -> dict[str, float]:
    from canvasread.canvas.engine.loader import load_checkpoint

    model = load_checkpoint(folder, random_init_std=0.02).model
    layer = model.model.encoder.language_model.layers[0]
    quantized = experts.Fp8Experts.of(layer.experts)
    rows = torch.randn(11_520 * 8, layer.experts.hidden_dim, device="cuda", dtype=torch.bfloat16)
    values, scales = experts.quantize_rows(rows)
    offsets = torch.linspace(0, rows.shape[0], layer.experts.num_experts + 1, device="cuda")[1:].int()
    result = {}
    for fast in (False, True):
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch._scaled_grouped_mm(values, quantized.gate_up.values.transpose(-2, -1), scales,
                                     quantized.gate_up.scales, offs=offsets, out_dtype=torch.bfloat16,
                                     use_fast_accum=fast)  # fmt: skip
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        result[f"gate_up_fp8_fast_accum_{fast}_ms"] = statistics.median(times[5:])
    return result


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    report: dict[str, Any] = {"fp32_engine_experts": fp32_check(folder)}
    print(report, flush=True)
    report["fp32_transformers_experts"] = with_reference_experts(folder)
    print(report, flush=True)
    report.update(fast_accum(folder))
    print(report, flush=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
