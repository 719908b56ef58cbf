"""Which SDPA kernel should a pass's attention take: the memory-efficient one it takes now, or cuDNN's?

Usage: python3 bench/attention_kernels.py OUT.json [cuda|cpu]

The engine attends through `scaled_dot_product_attention` with an additive
mask, so FlashAttention is never eligible, and the memory-efficient kernel
it takes keeps its accumulators in global memory at DiffusionGemma's head
dims (256 and 512): on the H200 it took 26 of a 32-request pass's 164 ms
(`bench/results/h200-2026-12-05b`). cuDNN's fused attention also takes an
additive mask, and torch tries it last unless told to try it first.

For passes of 1, 8 and 32 `standard`-shaped requests (`flex_attention.StandardPass`:
a shared 200-token prefix, each request a 156-token prompt row and a 16-token
canvas row), laid out by the engine's own `lay_out`, this times one layer of
each kind at the 26B-A4B shapes, both ways a pass attends: in groups
(`LayerStack.attend`, large passes) and flat (`LayerStack.attend_flat`, the
small passes a graph replays whole), under each kernel list below with torch's
priority set to the list's order. Per row: ms a layer (`expert_sum.median_ms`),
the CUDA kernels one call launched (which kernel really ran), the largest
difference from the memory-efficient kernel's output on real tokens, and the
first call's time, which holds cuDNN's plan for a new shape (the reason the
engine left it out: a grouped pass's shapes follow its rows). A kernel list
that fails on a shape says why. On a CPU (float32, 2 requests) only the math
kernel runs: it checks the script, not the kernels.

`gpu_attention_kernels.py` times the bare SDPA call on synthetic group shapes,
with each call's host time. This times what a pass really runs around it (the
store writes, the gathers of each group's keys, the copies back) on the
engine's own layouts, flat passes included, and names the kernel that ran.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from expert_sum import median_ms
from flex_attention import KINDS, StandardPass
from torch.nn.attention import SDPBackend, sdpa_kernel

from canvasread.canvas.engine.layers import LayerStack
from canvasread.canvas.engine.layout import Attention, PassLayout, flat_masks

KERNELS = {
    "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}


def attend(layout: PassLayout, kind: str, tensors: dict[str, Any], store: Any) -> torch.Tensor:
    """The engine's own attend (grouped or flat, as the layout says) for one layer of `kind`, store writes
    included, called on a stand-in that holds only what it reads."""
    stack = SimpleNamespace(layer_types=[kind])
    views = SimpleNamespace(
        query={kind: tensors["q"]},
        keys={kind: tensors["k"]},
        values={kind: tensors["v"]},
        attended={kind: torch.empty_like(tensors["q"])},
    )
    kv = SimpleNamespace(keys=[store[0]], values=[store[1]])
    if layout.flat is None:
        LayerStack.attend(stack, 0, views, layout, kv)  # type: ignore[arg-type]
    else:
        LayerStack.attend_flat(stack, 0, views, layout.flat, tensors["masks"], kv)  # type: ignore[arg-type]
    attended: torch.Tensor = views.attended[kind]
    return attended


def synchronized_ms(started: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1000.0


def kernels_of(call: Any) -> list[str]:
    """The distinct CUDA kernels one call launches, most time first (cut to 80 characters each)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        call()
        torch.cuda.synchronize()
    events = sorted(profile.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)
    return [event.key[:80] for event in events if event.self_device_time_total > 0][:6]


def measure_layout(layout: PassLayout, kind: str, slots: int, attention: Attention) -> dict[str, Any]:
    """One layer of `kind` over `layout` under each kernel list, on random queries, keys and store."""
    device, dtype = attention.device, attention.dtype
    query_heads, key_heads, dim = KINDS[kind]
    generator = torch.Generator(device).manual_seed(0)
    bucket = layout.size
    tensors: dict[str, Any] = {
        "q": torch.randn(bucket, query_heads, dim, device=device, dtype=dtype, generator=generator) / dim**0.5,
        "k": torch.randn(bucket, key_heads, dim, device=device, dtype=dtype, generator=generator),
        "v": torch.randn(bucket, key_heads, dim, device=device, dtype=dtype, generator=generator),
        "masks": flat_masks(layout.flat, attention) if layout.flat is not None else None,
    }
    store = tuple(torch.randn(slots, key_heads, dim, device=device, dtype=dtype, generator=generator) for _ in "kv")
    real = torch.arange(layout.used, device=device)
    lists = KERNELS if device.type == "cuda" else {"math": [SDPBackend.MATH]}
    row: dict[str, Any] = {}
    expected: torch.Tensor | None = None
    for name, kernels in lists.items():
        with sdpa_kernel(kernels, set_priority=True):
            try:
                started = time.perf_counter()
                got = attend(layout, kind, tensors, store)
                first_ms = synchronized_ms(started, device)
            except RuntimeError as error:
                row[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
                continue
            expected = got if expected is None else expected
            result: dict[str, Any] = {
                "first_ms": first_ms,
                "ms": median_ms(lambda: attend(layout, kind, tensors, store), device),
                "largest_difference": float((got[real] - expected[real]).abs().max()),
            }
            if device.type == "cuda":
                result["kernels"] = kernels_of(lambda: attend(layout, kind, tensors, store))
        row[name] = result
    return row


def measure(requests: int, device: torch.device) -> dict[str, Any]:
    """A pass of `requests` requests laid out both ways, each layer kind under each kernel list."""
    laid = StandardPass.of(requests, device)
    report: dict[str, Any] = dict(laid.sizes)
    for way, layout in {"grouped": laid.grouped, "flat": laid.flat}.items():
        for kind in KINDS:
            report[f"{way} {kind}"] = measure_layout(layout, kind, laid.slots, laid.attention)
            print(requests, way, kind, json.dumps(report[f"{way} {kind}"]), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("device", nargs="?", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    sizes = [1, 8, 32] if device.type == "cuda" else [2]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    report["passes"] = [measure(requests, device) for requests in sizes]
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
