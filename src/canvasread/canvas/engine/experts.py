"""The routed experts of a layer as two grouped matrix products, in bf16 or (opt-in) FP8 with rowwise scales.

Every (token, chosen expert) pair is sorted by expert, so each expert's rows
are contiguous and one grouped GEMM serves all experts (`torch._grouped_mm`),
with no per-expert loop, no host synchronisation and fixed shapes: it can be
captured in a CUDA graph and compiled; each token then gathers its rows back
for its weighted sum (`combined`). FP8 (`Fp8Experts`) stores each
expert's weights in float8 e4m3 with one scale per output row and quantizes
activations per row on the fly; on CUDA it runs `torch._scaled_grouped_mm`
(Hopper), elsewhere the same quantized values are multiplied in float32, so
the CPU tests measure the accuracy cost of the same numbers (all but the
GPU's fast accumulation). On a GPU, the pass sizes where one of the Triton
kernel's tiles (`expert_kernel.py`) beat the grouped GEMM at start-up take
the fastest tile instead, in bf16 and in FP8 (`choose_products`,
`expert_choice.py`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from canvasread.canvas.engine.expert_choice import TABLE, summary, trial

logger = logging.getLogger(__name__)

KERNEL: Callable[..., torch.Tensor] | None
CANDIDATES: tuple[Hashable, ...]
try:
    from canvasread.canvas.engine.expert_kernel import CANDIDATES, expert_rows

    KERNEL = expert_rows
except ImportError:  # no Triton (a CPU build of torch): the grouped GEMM serves every pass
    KERNEL, CANDIDATES = None, ()

# The largest finite float8 e4m3 value: scales map each row's largest magnitude onto it.
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


@dataclass(frozen=True)
class Fp8Weight:
    """[experts, out, in] weights in float8 e4m3 and their [experts, out] float32 scales."""

    values: torch.Tensor
    scales: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> Fp8Weight:
        scales = weight.detach().float().abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
        values = (weight.detach().float() / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return cls(values.contiguous(), scales.contiguous())


@dataclass(frozen=True)
class Fp8Experts:
    """One layer's expert weights in FP8 (the bf16 originals stay with the model for other readers)."""

    gate_up: Fp8Weight
    down: Fp8Weight

    @classmethod
    def of(cls, experts: Any) -> Fp8Experts:
        return cls(Fp8Weight.of(experts.gate_up_proj), Fp8Weight.of(experts.down_proj))


def routed_experts(
    experts: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, fp8: Fp8Experts | None
) -> torch.Tensor:
    """sum over k of weight_k * expert_k(hidden) per token, as `experts.forward` computes it; [tokens, width]."""
    top_k = top_k_index.shape[-1]
    # Sorted as int16 where the ids fit: a radix sort makes one pass per key byte, 2 instead of int64's 8.
    key = torch.int16 if experts.num_experts <= torch.iinfo(torch.int16).max else torch.int64
    expert_ids, order = torch.sort(top_k_index.reshape(-1).to(key), stable=True)
    source = order // top_k
    boundaries = torch.arange(1, experts.num_experts + 1, device=hidden.device, dtype=expert_ids.dtype)
    offsets = torch.searchsorted(expert_ids, boundaries).to(torch.int32)
    rows = gather_rows(hidden, source)
    if fp8 is None:
        gate_up = _grouped(rows, experts.gate_up_proj, offsets)
    else:
        gate_up = _scaled_grouped(rows, fp8.gate_up, offsets, hidden.dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    activated = experts.act_fn(gate) * up
    if fp8 is None:
        down = _grouped(activated, experts.down_proj, offsets)
    else:
        down = _scaled_grouped(activated, fp8.down, offsets, hidden.dtype)
    return combined(down, order, top_k_weights).to(hidden.dtype)


def combined(down: torch.Tensor, order: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """Each token's weighted sum of its experts' outputs (`down`, rows in expert order, `order` the pairs'
    token-major positions), in float32. Each token gathers its own rows back rather than the rows being added
    into their tokens: no atomics, the same on every run, each row read once (a scatter-add took 0.34 ms a layer
    of a 32-request pass on the H200, `bench/results/h200-2026-12-05/call3`). The top-k terms are added one by
    one, so Inductor writes one pointwise kernel whose threads read along the width; as a `sum(dim=1)` it wrote
    a reduction over the 8 terms whose neighbouring threads read rows apart (`bench/expert_sum.py`)."""
    tokens, top_k = top_k_weights.shape
    positions = torch.arange(order.shape[0], device=order.device, dtype=order.dtype)
    inverse = torch.empty_like(order).scatter_(0, order, positions)
    picked = down[inverse].view(tokens, top_k, down.shape[-1])
    weights = top_k_weights.float()
    total = picked[:, 0].float() * weights[:, 0, None]
    for k in range(1, top_k):
        total = total + picked[:, k].float() * weights[:, k, None]
    return total


@torch.library.custom_op("canvasread::gather_rows", mutates_args=())
def gather_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`source.index_select(0, index)`, opaque to the compiler. Fused by Inductor into the norm before it, the
    gather of a pass of 5,497 tokens took 0.92 ms a layer on the H200; ATen's vectorized gather takes 0.15 ms
    (bench/results/h200-2026-12-04d)."""
    return source.index_select(0, index)


@gather_rows.register_fake
def _gathered_shape(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return source.new_empty(index.shape[0], *source.shape[1:])


def _grouped(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """rows [S, in] times each group's weight [out, in] transposed: [S, out]."""
    rows = rows.to(weight.dtype)
    if rows.device.type == "cuda" and weight.dtype != torch.bfloat16:
        # CUDA's grouped GEMM takes bf16 only; fp32 checks on a GPU loop over the experts (host syncs).
        ends = offsets.tolist()
        starts = [0, *ends[:-1]]
        parts = [rows[start:end] @ weight[e].T for e, (start, end) in enumerate(zip(starts, ends, strict=True))]
        return torch.cat(parts)
    product: torch.Tensor = expert_product(rows, weight, offsets)
    return product


@torch.library.custom_op("canvasread::expert_product", mutates_args=())
def expert_product(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """`_grouped`'s product, opaque to the compiler, so the product is picked by the pass's real row count (one
    compiled body serves every bucket) and Inductor never rewrites the Triton kernel's launch."""
    tiles = TABLE.tiles(weight_key(weight), rows.shape[0])
    return _product(rows, weight, offsets, None, rows.dtype, tiles)


@expert_product.register_fake
def _product_shape(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], weight.shape[1])


def _product(
    rows: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None,
    dtype: torch.dtype,
    tiles: Hashable | None,
) -> torch.Tensor:
    """rows times each expert's weight, in `dtype`; FP8 operands with `scales` (the rows', the weight's): the
    Triton kernel with `tiles`, or (None) CUTLASS's grouped GEMM."""
    if tiles is not None and KERNEL is not None:
        return KERNEL(rows, weight, offsets, tiles, scales=scales, dtype=dtype)
    if scales is None:
        return torch._grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)
    return torch._scaled_grouped_mm(
        rows,
        weight.transpose(-2, -1),
        scales[0],
        scales[1],
        offs=offsets,
        out_dtype=dtype,
        # Hopper's fast FP8 accumulation: 3.1x faster at 92k rows (0.75 vs 2.34 ms, bench/results/
        # h200-2026-12-01); its extra rounding is in the accuracy figures measured on the GPU.
        use_fast_accum=True,
    )


def weight_key(weight: torch.Tensor) -> Hashable:
    """What `TABLE` knows a weight by: every layer's experts of one kind share their device, shape and dtype."""
    return str(weight.device), tuple(weight.shape), weight.dtype


def choose_products(experts: Any, fp8: Fp8Experts | None, row_counts: Sequence[int]) -> None:
    """Time the Triton kernel's candidate tiles against the grouped GEMM for both products of one layer's experts
    at each of `row_counts` (random rows and routing), and record which wins (`expert_choice`). On a GPU with
    Triton, for bf16 experts (FP8 with `fp8`); elsewhere the grouped GEMM serves every pass."""
    gate_up = experts.gate_up_proj
    if KERNEL is None or not gate_up.is_cuda or gate_up.dtype != torch.bfloat16:
        return
    generator = torch.Generator(gate_up.device).manual_seed(0)
    products: list[tuple[str, torch.Tensor, torch.Tensor | None]] = (
        [("gate and up", gate_up, None), ("down", experts.down_proj, None)]
        if fp8 is None
        else [
            ("FP8 gate and up", fp8.gate_up.values, fp8.gate_up.scales),
            ("FP8 down", fp8.down.values, fp8.down.scales),
        ]
    )
    for name, weight, weight_scales in products:
        trials = [
            trial(count, _random_product(weight, weight_scales, count, generator), name, CANDIDATES)
            for count in row_counts
        ]
        TABLE.record(weight_key(weight), trials)
        logger.info(summary(name, trials))


def _random_product(
    weight: torch.Tensor, weight_scales: torch.Tensor | None, count: int, generator: torch.Generator
) -> Callable[[Hashable | None], torch.Tensor]:
    """`_product` of `count` random rows, each routed to a random expert, given the kernel's tiles or None."""
    experts, _, depth = weight.shape
    device = weight.device
    rows = torch.randn(count, depth, device=device, dtype=torch.bfloat16, generator=generator)
    chosen = torch.randint(0, experts, (count,), device=device, generator=generator)
    offsets = torch.bincount(chosen, minlength=experts).cumsum(0).to(torch.int32)
    if weight_scales is None:
        return functools.partial(_product, rows, weight, offsets, None, rows.dtype)
    values, scales = quantize_rows(rows)
    return functools.partial(_product, values, weight, offsets, (scales, weight_scales), torch.bfloat16)


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 e4m3 rows and their float32 scales (one per row), as FP8 activations are fed to the kernel."""
    scales = rows.float().abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    values = (rows.float() / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values, scales


def _scaled_grouped(rows: torch.Tensor, weight: Fp8Weight, offsets: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    values, scales = quantize_rows(rows)
    if rows.device.type == "cuda":
        product: torch.Tensor = scaled_expert_product(values, scales, weight.values, weight.scales, offsets, dtype)
        return product
    # The same quantized operands, multiplied exactly in float32 (CPUs have no FP8 matrix units).
    dequantized_rows = values.float() * scales[:, None]
    dequantized_weight = weight.values.float() * weight.scales[..., None]
    return _grouped(dequantized_rows, dequantized_weight, offsets).to(dtype)


@torch.library.custom_op("canvasread::scaled_expert_product", mutates_args=())
def scaled_expert_product(
    values: torch.Tensor,
    scales: torch.Tensor,
    weight_values: torch.Tensor,
    weight_scales: torch.Tensor,
    offsets: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """FP8 rows (float8 values, float32 scales) times FP8 expert weights, in `dtype`; picked as `expert_product`."""
    tiles = TABLE.tiles(weight_key(weight_values), values.shape[0])
    return _product(values, weight_values, offsets, (scales, weight_scales), dtype, tiles)


@scaled_expert_product.register_fake
def _scaled_product_shape(
    values: torch.Tensor,
    scales: torch.Tensor,
    weight_values: torch.Tensor,
    weight_scales: torch.Tensor,
    offsets: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    return values.new_empty(values.shape[0], weight_values.shape[1], dtype=dtype)
