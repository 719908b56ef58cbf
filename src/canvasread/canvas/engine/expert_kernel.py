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
Swapped, it multiplies the weight tile by the rows: the columns become the
long side of Hopper's matrix unit (wgmma), the rows its short one.

Which pass sizes take it, and with which of `CANDIDATES`, is timed at start-up on the GPU it runs on
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
    swapped: bool = False  # multiply weight tile by rows (columns as the matrix unit's long side), not rows by weight

    def __str__(self) -> str:
        order = "swapped " if self.swapped else ""
        return f"{order}{self.rows}x{self.columns}x{self.depth}, {self.warps} warps, {self.stages} stages"


# The tiles the start-up tries at each pass size (`expert_choice.py`): in `bench/gpu_expert_kernel.py`'s sweep on
# an H100 (`bench/results/h100-2026-12-05f`) the best of 60 tiles at a later step's 16 tokens (swapped 32x128x128;
# for both products), at a lone read's 172 (swapped 32x64x64 for gate and up, 16x32x256 for down), and the tile
# the engine ran before that sweep. Each is within a few percent of another somewhere, so the GPU picks.
CANDIDATES = (
    Tiles(),
    Tiles(16, 32, 256, 4, 4),
    Tiles(32, 64, 64, 4, 3, swapped=True),
    Tiles(32, 128, 128, 8, 4, swapped=True),
)


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
    SWAPPED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    """out[r, n] = sum_k rows[r, k] * weight[e, n, k] for the rows r of expert e (program 0's index), n in this
    program's column block (program 1's index); expert e's rows end at offsets[e] and start at offsets[e - 1].
    SCALED: each product times row_scales[r] * weight_scales[e, n] (FP8 operands with rowwise scales).
    SWAPPED: the tile is summed as weight times rows, so the columns are the matrix unit's long side."""
    expert = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(offsets + expert - 1, mask=expert > 0, other=0)
    end = tl.load(offsets + expert)
    column_ok = columns < N
    matrix = weight + expert.to(tl.int64) * N * K
    for first in range(start, end, BLOCK_M):
        members = first + tl.arange(0, BLOCK_M)
        member_ok = members < end
        total = _tile_sum(rows, matrix, members, member_ok, columns, column_ok, K, BLOCK_K, SWAPPED)
        if SCALED:
            total *= tl.load(row_scales + members, mask=member_ok, other=0.0)[:, None]
            total *= tl.load(weight_scales + expert * N + columns, mask=column_ok, other=0.0)[None, :]
        tl.store(
            out + members[:, None] * N + columns[None, :],
            total.to(out.dtype.element_ty),
            mask=member_ok[:, None] & column_ok[None, :],
        )


@triton.jit  # type: ignore[untyped-decorator]
def _tile_sum(
    rows: tl.tensor,
    matrix: tl.tensor,
    members: tl.tensor,
    member_ok: tl.tensor,
    columns: tl.tensor,
    column_ok: tl.tensor,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAPPED: tl.constexpr,
) -> tl.tensor:
    """[BLOCK_M, BLOCK_N] fp32: the members' rows times the expert's `matrix` columns, over all of K. Both tiles
    are loaded reduction-first; SWAPPED sums the transposed product (columns times rows) and transposes once."""
    if SWAPPED:
        total = tl.zeros((columns.shape[0], members.shape[0]), dtype=tl.float32)
    else:
        total = tl.zeros((members.shape[0], columns.shape[0]), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        inner = k + tl.arange(0, BLOCK_K)
        inner_ok = inner < K
        a = tl.load(rows + members[None, :] * K + inner[:, None], mask=inner_ok[:, None] & member_ok[None, :])
        b = tl.load(matrix + columns[None, :] * K + inner[:, None], mask=inner_ok[:, None] & column_ok[None, :])
        if SWAPPED:
            total += tl.dot(tl.trans(b), a)
        else:
            total += tl.dot(tl.trans(a), b)
    if SWAPPED:
        total = tl.trans(total)
    return total


def expert_rows(
    rows: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    tiles: Tiles = CANDIDATES[0],
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
        SWAPPED=tiles.swapped,
        BLOCK_M=tiles.rows,
        BLOCK_N=tiles.columns,
        BLOCK_K=tiles.depth,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return out
