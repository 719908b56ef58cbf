"""The GPU speed paths, checked where a CPU can check them: FP8 experts' accuracy cost and compiled layer bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from canvasread.canvas.engine.accuracy import read_agreement
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.weights import build_random
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.bench import cold_body, planned_reads, standard_body


def fixed_reads(loaded: Any, count: int) -> list[CanvasRead]:
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(loaded.model.config.canvas_length), max_positions=None)
    bodies = [standard_body(n) for n in range(count)] + [cold_body(n) for n in range(count)]
    return planned_reads(planner, bodies, tokenizer.vocab_size)


def test_fp8_experts_cost_little_accuracy_on_the_tiny_model(tiny_checkpoint: Path) -> None:
    """The FP8 path on a CPU multiplies the same quantized operands as on a GPU, so its cost is measured here."""
    loaded = load_checkpoint(str(tiny_checkpoint))
    reads = fixed_reads(loaded, 6)
    exact = InProcessReader(FusedRunner(loaded.model))
    fp8 = InProcessReader(FusedRunner(loaded.model, fp8_experts=True))
    agreement = read_agreement(exact, fp8, reads)
    assert agreement.slots == 36
    assert 0.0 < agreement.mean_kl < 0.02, agreement  # quantized (not identical), yet close (measured 0.007)
    assert agreement.argmax_agreement >= 0.9, agreement


def test_a_broken_quantization_would_show(tiny_checkpoint: Path) -> None:
    """The bound above can fail: gate-up scales given to the wrong rows move it past it."""
    loaded = load_checkpoint(str(tiny_checkpoint))
    reads = fixed_reads(loaded, 2)
    runner = FusedRunner(loaded.model, fp8_experts=True)
    for quantized in runner.stack.fp8:
        assert quantized is not None
        quantized.gate_up.scales.copy_(quantized.gate_up.scales.flip(-1))  # each row scaled by another's scale
    agreement = read_agreement(InProcessReader(FusedRunner(loaded.model)), InProcessReader(runner), reads)
    assert agreement.mean_kl > 0.02 or agreement.argmax_agreement < 0.9, agreement


def test_compiled_layer_bodies_trace_whole_and_equal_eager_ones() -> None:
    """`torch.compile` over the layer body, with Dynamo's eager backend: no graph breaks, same numbers."""
    from torch._dynamo.utils import counters
    from transformers import DiffusionGemmaForBlockDiffusion

    from canvasread.canvas.engine.rows import Row
    from canvasread.tools.checkpoints import tiny_config

    # bf16: the grouped expert GEMM's compiled form takes bf16 only (as on the GPU).
    model = build_random(
        DiffusionGemmaForBlockDiffusion,
        tiny_config(vocab_size=512),
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        std=0.3,
    ).eval()
    eager = FusedRunner(model)
    compiled = FusedRunner(model, compile="eager")
    generator = torch.Generator().manual_seed(3)

    def ids(count: int) -> list[int]:
        return torch.randint(3, 512, (count,), generator=generator).tolist()

    [prefix] = eager.run([Row(None, ids(30), (), (), (), keep_kv=True)])
    rows = [Row(prefix.kv, ids(n), ids(16), (2, 5), ((5, 6), (7, 8, 9))) for n in (3, 9)]
    counters.clear()
    for want, got in zip(eager.run(rows), compiled.run(rows), strict=True):
        for x, y in zip(want.label_logprobs, got.label_logprobs, strict=True):
            assert torch.allclose(x, y, atol=1e-2)
    assert compiled.stack.compiled, "the compiled body fell back to eager"
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2  # one per layer kind (sliding, full), shared by their layers


@pytest.mark.parametrize("make", [standard_body, cold_body])
def test_workload_bodies_differ_per_request_as_named(make: Any) -> None:
    first, second = make(1), make(2)
    assert first["state"] != second["state"]
    same_instructions = first["questions"] == second["questions"]
    assert same_instructions == (make is standard_body)
