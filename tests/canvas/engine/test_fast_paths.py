"""The GPU speed paths, checked where a CPU can check them: FP8 experts' accuracy cost and compiled pieces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from canvasread.canvas.engine.accuracy import read_agreement
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import Buckets
from canvasread.canvas.engine.weights import build_random
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead, Slot
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.workloads import cold_body, planned_reads, standard_body


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


def bf16_tiny_model() -> Any:
    from transformers import DiffusionGemmaForBlockDiffusion

    from canvasread.tools.checkpoints import tiny_config

    # bf16: the grouped expert GEMM's compiled form takes bf16 only (as on the GPU).
    return build_random(
        DiffusionGemmaForBlockDiffusion,
        tiny_config(vocab_size=512),
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        std=0.3,
    ).eval()


def spread_reads(count: int, seed: int) -> list[CanvasRead]:
    """Reads of prompts and canvases of many lengths, some sharing a prefix, some taking denoising steps."""
    generator = torch.Generator().manual_seed(seed)

    def ids(length: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, 512, (length,), generator=generator).tolist())

    prefix = ids(20)
    reads = []
    for n in range(count):
        prompt = prefix + ids(3 + 11 * n) if n % 2 else ids(5 + 7 * n)
        canvas = ids(16 * (1 + n % 3))
        slots = (Slot(2, (5, 6)), Slot(len(canvas) - 1, (7, 8, 9)))
        reads.append(CanvasRead(prompt, 20 if n % 2 else 0, canvas, slots, steps=1 + n % 3, seed=n))
    return reads


def test_compiled_pieces_trace_whole_and_equal_eager_ones() -> None:
    """`torch.compile` over the token-wise pieces, with Dynamo's eager backend: no graph breaks, same numbers."""
    from torch._dynamo.utils import counters

    model = bf16_tiny_model()
    buckets = Buckets((16, 32, 64, 128, 256))
    reads = spread_reads(5, seed=3)
    want = InProcessReader(FusedRunner(model, buckets=buckets)).read(reads)
    counters.clear()
    runner = FusedRunner(model, compile="eager", buckets=buckets)
    runner.warm_up()
    got = InProcessReader(runner).read(reads)
    for a, b in zip(want, got, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.label_logprobs == pytest.approx(y.label_logprobs, abs=1e-2)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # pre and post per layer kind (sliding, full), shared by the layers of that kind and by every bucket, and a
    # denoising step's arithmetic, one for canvases of every width (these reads take up to 3 steps).
    assert counters["stats"]["unique_graphs"] == 5


def test_after_warm_up_no_pass_compiles_whatever_its_shape() -> None:
    """Warm-up compiles every bucket; reads of shapes it never saw then compile nothing."""
    from torch._dynamo.utils import counters

    runner = FusedRunner(bf16_tiny_model(), compile="eager", buckets=Buckets((16, 32, 64, 128, 256, 512)))
    runner.warm_up()
    reader = InProcessReader(runner)
    compiled_at_ready = counters["stats"]["unique_graphs"]
    for seed in range(3):
        reader.read(spread_reads(4 + 2 * seed, seed=seed))
    assert counters["stats"]["unique_graphs"] == compiled_at_ready
    assert reader.counters()["compiles"] == 0


def test_a_recompile_after_warm_up_is_counted_and_the_pass_runs_eagerly() -> None:
    from canvasread.canvas.engine.experts import Fp8Experts

    model = bf16_tiny_model()
    reads = spread_reads(3, seed=7)
    runner = FusedRunner(model, compile="eager", buckets=Buckets((16, 32, 64, 128, 256)))
    runner.warm_up()
    reader = InProcessReader(runner)
    # A guard the warm-up never met (FP8 experts swapped in on one layer): a bug the engine must survive.
    runner.stack.fp8[0] = Fp8Experts.of(runner.stack.layers[0].experts)
    got = reader.read(reads)
    assert reader.counters()["compiles"] >= 1
    eager = FusedRunner(model, buckets=Buckets((16, 32, 64, 128, 256)))
    eager.stack.fp8[0] = runner.stack.fp8[0]
    for a, b in zip(InProcessReader(eager).read(reads), got, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.label_logprobs == pytest.approx(y.label_logprobs, abs=1e-2)


@pytest.mark.parametrize("make", [standard_body, cold_body])
def test_workload_bodies_differ_per_request_as_named(make: Any) -> None:
    first, second = make(1), make(2)
    assert first["state"] != second["state"]
    same_instructions = first["questions"] == second["questions"]
    assert same_instructions == (make is standard_body)


def test_a_denoising_step_that_fails_to_compile_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    """A compiler that fails at warm-up must not stop the engine: the step stays eager, exact, with a warning."""
    from canvasread.canvas.engine.heads import SlotHead

    @torch._dynamo.register_backend(name="canvasread_test_broken")
    def broken(graph: Any, inputs: Any) -> Any:
        raise RuntimeError("this backend builds nothing")

    model = bf16_tiny_model()
    head = SlotHead(model, compile="canvasread_test_broken")
    with torch.inference_mode():
        head.warm_up()
        normed = torch.randn(5, model.config.text_config.hidden_size, dtype=torch.bfloat16)
        got, want = head.scaled(normed, 0.7), SlotHead(model).scaled(normed, 0.7)
    assert not head.compiled
    assert "did not compile" in caplog.text
    assert torch.equal(got.probs, want.probs) and torch.equal(got.mixture, want.mixture)


def test_inductor_builds_the_denoising_step_once_for_every_canvas_width() -> None:
    """The GPU's compiler (Inductor, here generating CPU code) may add guards of its own beyond Dynamo's: after
    the head's warm-up, canvases of other widths must reuse its build, and give the eager step's numbers."""
    from canvasread.canvas.engine.heads import SlotHead

    model = bf16_tiny_model()
    compiled, eager = SlotHead(model, compile="inductor"), SlotHead(model)
    with torch.inference_mode():
        compiled.warm_up()
        assert compiled.compiled
        generator = torch.Generator().manual_seed(4)
        with torch.compiler.set_stance("fail_on_recompile"):
            for width in (2, 3, 17, 64, 300):
                normed = torch.randn(width, model.config.text_config.hidden_size, generator=generator)
                got = compiled.scaled(normed.to(torch.bfloat16), 0.55)
                want = eager.scaled(normed.to(torch.bfloat16), 0.55)
                torch.testing.assert_close(got.probs, want.probs, rtol=1e-4, atol=1e-6)
                torch.testing.assert_close(got.entropy, want.entropy, rtol=1e-4, atol=1e-4)
                assert torch.equal(got.argmax, want.argmax)
                torch.testing.assert_close(got.mixture, want.mixture, rtol=2**-7, atol=1e-6)  # one bf16 step
