"""The routed experts' matrix product for small passes, as one Triton kernel that reads each used weight once.

In a small pass each expert gets a few (token, expert) rows, and CUTLASS's
grouped GEMM (`torch._grouped_mm`), built for wide tiles, streamed the
experts' weights at about 60% of the H200's bandwidth in a lone read
(`bench/results/h200-2026-12-04d`). Here each program owns one expert's
`BLOCK_N` output columns: it loops over that expert's rows `BLOCK_M` at a
time (one chunk in a small pass, so its weight tile is read once) and skips
experts no token chose. There is no host synchronisation and the grid
depends only on the weight's shape, so the kernel runs inside CUDA graphs;
the row counts are read from `offsets` on the GPU, so one build serves
every pass size. On the H200 it took passes of 16-128 tokens 5-6 ms faster
and a lone `standard` read about 1 ms (`bench/results/h200-2026-12-05b`).

Which pass sizes take it is timed at start-up on the GPU it runs on
(`expert_choice.py`); `experts.expert_product` looks a pass's row count up,
behind an op the compiler leaves alone. Triton's interpreter
(`TRITON_INTERPRET=1`) runs the same kernel on a CPU, which is how the tests
check its indexing; they also build it for Hopper with Triton's compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Tiles:
    """A launch of the kernel: rows, output columns and reduction per tile, warps and pipeline stages."""

    rows: int = 16
    columns: int = 64
    depth: int = 128
    warps: int = 4
    stages: int = 4


# 16-row tiles for passes where each expert has a few rows. In `bench/gpu_expert_kernel.py`'s sweep on an H100
# (`bench/results/h100-2026-12-05`), at 172 tokens, these were the best for the down product (with 5 stages) and
# within 2% of the best for gate and up (64-row tiles, which lose to the grouped GEMM at 1,024 tokens anyway).
TILES = Tiles()


@triton.jit  # type: ignore[untyped-decorator]
def _expert_rows_kernel(
    rows: tl.tensor,
    weight: tl.tensor,
    offsets: tl.tensor,
    out: tl.tensor,
    row_scales: tl.tensor,
    weight_scales: tl.tensor,
    N: tl.constexpr,
    K: tl.constexpr,
    SCALED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    """out[r, n] = sum_k rows[r, k] * weight[e, n, k] for the rows r of expert e (program 0's index), n in this
    program's column block (program 1's index); expert e's rows end at offsets[e] and start at offsets[e - 1].
    SCALED: each product times row_scales[r] * weight_scales[e, n] (FP8 operands with rowwise scales)."""
    expert = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(offsets + expert - 1, mask=expert > 0, other=0)
    end = tl.load(offsets + expert)
    reduction = tl.arange(0, BLOCK_K)
    column_ok = columns < N
    tile = weight + expert.to(tl.int64) * N * K + columns[None, :] * K
    for first in range(start, end, BLOCK_M):
        members = first + tl.arange(0, BLOCK_M)
        member_ok = members < end
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            inner = k + reduction
            inner_ok = inner < K
            a = tl.load(rows + members[:, None] * K + inner[None, :], mask=member_ok[:, None] & inner_ok[None, :])
            b = tl.load(tile + inner[:, None], mask=inner_ok[:, None] & column_ok[None, :])
            total += tl.dot(a, b)
        if SCALED:
            total *= tl.load(row_scales + members, mask=member_ok, other=0.0)[:, None]
            total *= tl.load(weight_scales + expert * N + columns, mask=column_ok, other=0.0)[None, :]
        tl.store(
            out + members[:, None] * N + columns[None, :],
            total.to(out.dtype.element_ty),
            mask=member_ok[:, None] & column_ok[None, :],
        )


def expert_rows(
    rows: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    tiles: Tiles = TILES,
    *,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """rows [S, in], sorted by expert, times each expert's weight [out, in] transposed: [S, out] in `dtype`
    (default: rows' dtype). `offsets` [experts] (int32) holds where each expert's rows end, as
    `torch._grouped_mm` takes them. With `scales` (the rows' [S] and the weight's [experts, out], float32) the
    operands are FP8 values and each product is scaled back, as `torch._scaled_grouped_mm` does."""
    experts, width, depth = weight.shape
    out = torch.empty(rows.shape[0], width, dtype=dtype or rows.dtype, device=rows.device)
    row_scales, weight_scales = scales if scales is not None else (out, out)  # not read unless SCALED
    _expert_rows_kernel[(experts, triton.cdiv(width, tiles.columns))](
        rows.contiguous(),
        weight.contiguous(),
        offsets,
        out,
        row_scales.contiguous(),
        weight_scales.contiguous(),
        N=width,
        K=depth,
        SCALED=scales is not None,
        BLOCK_M=tiles.rows,
        BLOCK_N=tiles.columns,
        BLOCK_K=tiles.depth,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return out
