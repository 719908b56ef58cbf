"""Time the engine's reader directly (no HTTP) on the full-size DiffusionGemma shape with random weights.

Usage (on a GPU machine, from the repository root):
    PYTHONPATH=src python3 bench/gpu_runner.py MODEL_FOLDER OUT.json [VARIANT ...]

VARIANT is eager (CUDA graphs, no compile), compiled (graphs + torch.compile
of the layer bodies) or compiled-fp8 (the same with FP8 experts); default:
all three. Each variant gets a fresh runner on one shared model: start-up
(compile and capture) time, batch-1 reads of the standard and the cold
workload (a fresh request each, as a server sees them), and passes of
8/64/256 distinct standard requests. FP8 is also compared with bf16 on a
fixed request set (mean KL, argmax agreement), and the FP8 grouped GEMM with
the bf16 one on one layer's experts. Results are written after every step,
so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from canvasread.canvas.engine.accuracy import read_agreement
from canvasread.canvas.engine.experts import Fp8Experts, routed_experts
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.mixed import mixed_body
from canvasread.tools.workloads import cold_body, planned_reads, standard_body

VARIANTS = {"eager": (None, False), "compiled": ("inductor", False), "compiled-fp8": ("inductor", True)}


class Requests:
    """Fresh request bodies, planned into reads; never the same request twice."""

    def __init__(self, planner: Planner, vocab: int) -> None:
        self.planner, self.vocab, self.next = planner, vocab, 10_000

    def reads(self, count: int, make: Callable[[int], dict[str, Any]] = standard_body) -> list[CanvasRead]:
        bodies = [make(self.next + i) for i in range(count)]
        self.next += count
        return planned_reads(self.planner, bodies, self.vocab)


def timed_ms(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1000.0


def singles(reader: InProcessReader, requests: Requests, make: Callable[[int], dict[str, Any]]) -> dict[str, float]:
    times = []
    for _ in range(25):
        batch = requests.reads(1, make)
        times.append(timed_ms(lambda b=batch: reader.read(b)))  # type: ignore[misc]
    times = times[3:]
    return {"p50": statistics.median(times), "min": min(times), "p90": statistics.quantiles(times, n=10)[8]}


def variant(model: Any, name: str, requests: Requests) -> dict[str, Any]:
    compile, fp8 = VARIANTS[name]
    entry: dict[str, Any] = {}
    started = time.perf_counter()
    runner = FusedRunner(model, cuda_graphs=True, compile=compile, fp8_experts=fp8)
    runner.warm_up()
    torch.cuda.synchronize()
    entry["start_up_s"] = time.perf_counter() - started
    entry["compiled"] = runner.stack.compiled
    reader = InProcessReader(runner)
    reader.read(requests.reads(3))  # the standard prefix enters the cache
    entry["batch1_standard_ms"] = singles(reader, requests, standard_body)
    entry["batch1_cold_ms"] = singles(reader, requests, cold_body)
    batches = {}
    for size in (8, 64, 256):
        times = []
        for _ in range(3):
            batch = requests.reads(size)
            times.append(timed_ms(lambda b=batch: reader.read(b)))  # type: ignore[misc]
        ms = statistics.median(times[1:])
        batches[str(size)] = {"ms": ms, "decisions_per_s": 3 * size * 1000.0 / ms}
        print(name, size, round(ms, 1), "ms", round(3 * size * 1000.0 / ms), "decisions/s", flush=True)
    entry["batches"] = batches
    entry["mixed_batches"] = mixed_batches(reader, requests, name)
    entry["counters"] = dict(reader.counters())
    return entry


def mixed_batches(reader: InProcessReader, requests: Requests, name: str) -> dict[str, Any]:
    """Passes of 16 and 64 requests of the mixed workload (each read once: the reader alone, no re-reads)."""
    timed = {}
    for size in (16, 64):
        runs = []
        for _ in range(3):
            start = requests.next
            decisions = sum(len(mixed_body(start + i)["questions"]) for i in range(size))
            batch = requests.reads(size, mixed_body)
            runs.append((timed_ms(lambda b=batch: reader.read(b)), decisions))  # type: ignore[misc]
        ms = statistics.median(ms for ms, _ in runs[1:])
        per_s = sum(d for _, d in runs[1:]) * 1000.0 / sum(ms for ms, _ in runs[1:])
        timed[str(size)] = {"ms": ms, "decisions_per_s": per_s}
        print(name, "mixed", size, round(ms, 1), "ms", round(per_s), "decisions/s", flush=True)
    return timed


def fp8_kernel(model: Any) -> dict[str, Any]:
    """One layer's experts in bf16 and FP8 at 180 and 11,520 tokens: time and relative error vs bf16."""
    layer = model.model.encoder.language_model.layers[0]
    quantized = Fp8Experts.of(layer.experts)
    device, top_k = layer.experts.gate_up_proj.device, int(model.config.text_config.top_k_experts)
    result: dict[str, Any] = {}
    for tokens in (180, 11_520):
        hidden = torch.randn(tokens, layer.experts.hidden_dim, device=device, dtype=torch.bfloat16)
        scores = torch.randn(tokens, layer.experts.num_experts, device=device).softmax(-1)
        weights, index = scores.topk(top_k, dim=-1)
        outs = {}
        for label, fp8 in (("bf16", None), ("fp8", quantized)):

            def call(f: Fp8Experts | None = fp8, h: Any = hidden, i: Any = index, w: Any = weights) -> torch.Tensor:
                return routed_experts(layer.experts, h, i, w, f)

            outs[label] = call()
            runs = [timed_ms(call) for _ in range(20)]
            result[f"{label}_{tokens}_ms"] = statistics.median(runs[5:])
        error = (outs["fp8"].float() - outs["bf16"].float()).norm() / outs["bf16"].float().norm()
        result[f"fp8_rel_error_{tokens}"] = float(error)
    return result


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    names = sys.argv[3:] or list(VARIANTS)
    started = time.perf_counter()
    loaded = load_checkpoint(folder, random_init_std=0.02)
    model = loaded.model
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(model.config.canvas_length), max_positions=None)
    requests = Requests(planner, tokenizer.vocab_size)
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    results["build_s"] = time.perf_counter() - started
    results["memory_gb"] = torch.cuda.memory_allocated() / 1e9

    def save() -> None:
        results["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
        out.write_text(json.dumps(results, indent=2) + "\n")

    if any(name.endswith("fp8") for name in names):
        results["fp8_kernel"] = fp8_kernel(model)
        print(json.dumps(results["fp8_kernel"]), flush=True)
        save()
    for name in names:
        results[name] = variant(model, name, requests)
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "batches"}), flush=True)
        save()
    if "compiled" in names and "compiled-fp8" in names:
        bodies = [standard_body(n) for n in range(32)] + [cold_body(n) for n in range(32)]
        fixed = planned_reads(planner, bodies, tokenizer.vocab_size)
        eager = InProcessReader(FusedRunner(model))
        bf16 = InProcessReader(FusedRunner(model, compile="inductor"))
        fp8 = InProcessReader(FusedRunner(model, compile="inductor", fp8_experts=True))
        # bf16 against bf16 computed in another order: the noise floor of random-weight routing near ties.
        results["compiled_vs_eager_bf16"] = asdict(read_agreement(eager, bf16, fixed))
        results["fp8_vs_bf16"] = asdict(read_agreement(bf16, fp8, fixed))
        print("compiled vs eager", results["compiled_vs_eager_bf16"], "fp8 vs bf16", results["fp8_vs_bf16"], flush=True)
        save()


if __name__ == "__main__":
    main()
