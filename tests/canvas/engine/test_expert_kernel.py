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

calls = []
kernel = experts.KERNEL
experts.KERNEL = lambda *args, **kwargs: calls.append(len(args[0])) or kernel(*args, **kwargs)
weight = torch.randn(3, 24, 40)
TABLE.record(experts.weight_key(weight), [Trial(16, 1.0, 0.5), Trial(32, 1.0, 2.0)])
for rows in (16, 32):
    hidden = torch.randn(rows, 40)
    offsets = torch.tensor([rows // 4, rows // 2, rows], dtype=torch.int32)
    expected = torch._grouped_mm(hidden, weight.transpose(-2, -1), offs=offsets)
    assert (experts.expert_product(hidden, weight, offsets) - expected).abs().max() < 1e-4
print(calls)
"""


def test_a_pass_takes_the_kernel_at_the_row_counts_its_trial_won() -> None:
    """The op a compiled pass calls looks its row count up in the start-up trial's table: the kernel where it
    won (16 rows), the grouped GEMM where it lost (32), the same numbers either way."""
    done = subprocess.run(
        [sys.executable, "-c", PICKED], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[16]"]


HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from canvasread.canvas.engine.expert_kernel import TILES, _expert_rows_kernel as kernel

# DiffusionGemma-26B-A4B's two products, in bf16 and in FP8 (out: bf16; scales: float32, or unread).
for operands, scales, width, depth in [("*bf16", "*bf16", 1408, 2816), ("*bf16", "*bf16", 2816, 704),
                                       ("*fp8e4nv", "*fp32", 1408, 2816), ("*fp8e4nv", "*fp32", 2816, 704)]:
    values = {"N": width, "K": depth, "SCALED": scales == "*fp32", "BLOCK_M": TILES.rows, "BLOCK_N": TILES.columns,
              "BLOCK_K": TILES.depth}
    pointers = {"rows": operands, "weight": operands, "offsets": "*i32", "out": "*bf16", "row_scales": scales,
                "weight_scales": scales}
    signature = {name: pointers.get(name, "constexpr") for name in kernel.arg_names}
    constants = {(kernel.arg_names.index(name),): value for name, value in values.items()}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    built = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": TILES.warps, "num_stages": TILES.stages})
    print(operands, width, depth, "mma" in built.asm["ptx"])
"""


def test_every_launch_the_engine_makes_builds_for_hopper(tmp_path: Path) -> None:
    """Triton's interpreter runs any Python; its compiler does not (a global in an annotation fails the build).
    So each launch the engine makes on the 26B checkpoint is built for an H100/H200 (sm_90), on the CPU, with
    the ptxas Triton carries, and its products run on the matrix units."""
    environment = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", HOPPER], env=environment, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "*bf16 1408 2816 True",
        "*bf16 2816 704 True",
        "*fp8e4nv 1408 2816 True",
        "*fp8e4nv 2816 704 True",
    ]
