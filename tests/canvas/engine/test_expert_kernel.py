"""The routed experts' Triton kernel, run by Triton's interpreter on the CPU against the grouped GEMM.

The interpreter is chosen when a kernel is defined, so each check runs in a
fresh interpreter process with `TRITON_INTERPRET=1`. It multiplies in
float32: its bfloat16 products are wrong (they multiply the raw bits), and
the bfloat16 and FP8 launches are checked on the GPU against the grouped
GEMMs by `bench/gpu_expert_kernel.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canvasread.canvas.engine.expert_kernel import CANDIDATES

CHECK = """
import sys
import torch
from canvasread.canvas.engine.expert_kernel import Tiles, expert_rows

counts, width, depth, tiles, scaled = eval(sys.argv[1])
torch.manual_seed(0)
counts = torch.tensor(counts)
rows = torch.randn(int(counts.sum()), depth)
weight = torch.randn(len(counts), width, depth)
offsets = counts.cumsum(0).to(torch.int32)
if scaled:
    row_scales, weight_scales = torch.rand(len(rows)) + 0.5, torch.rand(len(counts), width) + 0.5
    out = expert_rows(rows, weight, offsets, Tiles(*tiles), scales=(row_scales, weight_scales))
    rows, weight = rows * row_scales[:, None], weight * weight_scales[..., None]
else:
    out = expert_rows(rows, weight, offsets, Tiles(*tiles))
expected = torch._grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)
print(out.shape == expected.shape, float((out - expected).abs().max()))
"""


def _kernel(
    counts: list[int], width: int, depth: int, tiles: tuple[int, ...], *, scaled: bool = False
) -> tuple[bool, float]:
    environment = {**os.environ, "TRITON_INTERPRET": "1"}
    argument = repr((counts, width, depth, tiles, scaled))
    done = subprocess.run(
        [sys.executable, "-c", CHECK, argument], env=environment, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    same_shape, error = done.stdout.split()
    return same_shape == "True", float(error)


@pytest.mark.parametrize(
    ("counts", "width", "depth", "tiles"),
    [
        # Unused experts, an expert of one row, one of more rows than a tile, widths off the tiles' multiples.
        ([0, 3, 17, 0, 40, 1], 80, 144, (16, 32, 64, 4, 2)),
        # The real model's proportions (gate and up: twice the expert width out), a pass of every expert.
        ([5, 2, 9, 16], 96, 48, (16, 64, 32, 4, 3)),
        # Swapped (the weight tile times the rows), with the same ragged experts and widths.
        ([0, 3, 17, 0, 40, 1], 80, 144, (16, 64, 64, 4, 2, True)),
    ],
)
def test_the_kernel_equals_the_grouped_product(
    counts: list[int], width: int, depth: int, tiles: tuple[int, ...]
) -> None:
    same_shape, error = _kernel(counts, width, depth, tiles)
    assert same_shape
    assert error < 1e-4


def test_scaled_the_kernel_multiplies_each_product_by_its_row_and_column_scales() -> None:
    """The FP8 launch's arithmetic (float32 operands here: the interpreter has no FP8 products): each output is
    the product of the scaled-back operands, as `torch._scaled_grouped_mm` takes rowwise scales."""
    same_shape, error = _kernel([4, 0, 21, 2], 48, 80, (16, 32, 32, 4, 2), scaled=True)
    assert same_shape
    assert error < 1e-4


PICKED = """
import torch
from canvasread.canvas.engine import experts
from canvasread.canvas.engine.expert_choice import TABLE, Trial
from canvasread.canvas.engine.expert_kernel import Tiles

calls = []
kernel = experts.KERNEL
experts.KERNEL = lambda *args, **kwargs: calls.append((len(args[0]), str(args[3]))) or kernel(*args, **kwargs)
weight = torch.randn(3, 24, 40)
tiles = Tiles(16, 32, 32, 4, 2, swapped=True)
won, lost = Trial(16, 1.0, ((Tiles(), 0.9), (tiles, 0.5))), Trial(32, 1.0, ((tiles, 2.0),))
TABLE.record(experts.weight_key(weight), [won, lost])
for rows in (16, 32):
    hidden = torch.randn(rows, 40)
    offsets = torch.tensor([rows // 4, rows // 2, rows], dtype=torch.int32)
    expected = torch._grouped_mm(hidden, weight.transpose(-2, -1), offs=offsets)
    assert (experts.expert_product(hidden, weight, offsets) - expected).abs().max() < 1e-4
print(calls)
"""


def test_a_pass_takes_the_winning_tile_at_the_row_counts_its_trial_won() -> None:
    """The op a compiled pass calls looks its row count up in the start-up trial's table: the kernel with the
    fastest tile where it won (16 rows), the grouped GEMM where it lost (32), the same numbers either way."""
    done = subprocess.run(
        [sys.executable, "-c", PICKED], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[(16, 'swapped 16x32x32, 4 warps, 2 stages')]"


HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from canvasread.canvas.engine.expert_kernel import CANDIDATES, _expert_rows_kernel as kernel

# DiffusionGemma-26B-A4B's two products, in bf16 and in FP8 (out: bf16; scales: float32, or unread), with every
# candidate tile; pointers 16-byte aligned, as torch's allocations are and Triton specialises launches on.
for tiles in CANDIDATES:
    for operands, scales, width, depth in [("*bf16", "*bf16", 1408, 2816), ("*bf16", "*bf16", 2816, 704),
                                           ("*fp8e4nv", "*fp32", 1408, 2816), ("*fp8e4nv", "*fp32", 2816, 704)]:
        values = {"N": width, "K": depth, "SCALED": scales == "*fp32", "SWAPPED": tiles.swapped,
                  "BLOCK_M": tiles.rows, "BLOCK_N": tiles.columns, "BLOCK_K": tiles.depth}
        pointers = {"rows": operands, "weight": operands, "offsets": "*i32", "out": "*bf16", "row_scales": scales,
                    "weight_scales": scales}
        signature = {name: pointers.get(name, "constexpr") for name in kernel.arg_names}
        constants = {(kernel.arg_names.index(name),): value for name, value in values.items()}
        aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in pointers}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
        built = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": tiles.warps, "num_stages": tiles.stages})
        ptx = built.asm["ptx"]
        print(operands, width, depth, "mma" in ptx, "cp.async" in ptx)
"""


def test_every_launch_the_engine_makes_builds_for_hopper(tmp_path: Path) -> None:
    """Triton's interpreter runs any Python; its compiler does not (a global in an annotation fails the build).
    So each launch the engine may make on the 26B checkpoint, every candidate tile, is built for an H100/H200
    (sm_90), on the CPU, with the ptxas Triton carries: its products run on the matrix units and its loads are
    pipelined (asynchronous copies)."""
    environment = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", HOPPER], env=environment, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    launches = ["*bf16 1408 2816", "*bf16 2816 704", "*fp8e4nv 1408 2816", "*fp8e4nv 2816 704"]
    assert done.stdout.splitlines() == [f"{launch} True True" for launch in launches] * len(CANDIDATES)
