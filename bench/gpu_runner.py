"""Time the engine's readers directly (no HTTP) on the full-size DiffusionGemma shape with random weights.

Usage (on a GPU machine, from the repository root):
    PYTHONPATH=src python3 bench/gpu_runner.py MODEL_FOLDER OUT.json [--experts eager,grouped_mm]

MODEL_FOLDER holds the full-size config.json and a tokenizer; weights are drawn
from N(0, 0.02) on the GPU. For each experts kernel it times: the fused reader
at batch 1 (instruction prefix cached, a fresh state per request, as a server
sees it), the fused reader on batches of distinct requests, and the naive
path (one full transformers forward per request). It also checks the fused
path against the naive one on the same inputs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.naive import NaiveReader
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.plan import Planner, noisy_canvas
from canvasread.canvas.reader import CanvasRead, Slot
from canvasread.canvas.readout import slot_reading
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.bench import standard_body
from canvasread.wire import parse_request


def reads_for(planner: Planner, vocab: int, start: int, count: int) -> list[CanvasRead]:
    reads = []
    for sequence in range(start, start + count):
        _, request = parse_request(standard_body(sequence))
        plan = planner.plan(request)
        for canvas in plan.canvases:
            ids = noisy_canvas(canvas, plan.questions, vocab_size=vocab, seed=sequence, read=0)
            slots = tuple(Slot(plan.questions[q].position, plan.questions[q].label_ids) for q in canvas.questions)
            reads.append(CanvasRead(plan.prompt_ids, plan.prefix_length, ids, slots))
    return reads


def timed(fn: Any) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1000.0


def main() -> None:
    folder, out = sys.argv[1], sys.argv[2]
    kernels = sys.argv[sys.argv.index("--experts") + 1].split(",") if "--experts" in sys.argv else ["grouped_mm"]
    started = time.perf_counter()
    loaded = load_checkpoint(folder, random_init_std=0.02, experts=kernels[0])
    build_s = time.perf_counter() - started
    model = loaded.model
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(model.config.canvas_length), max_positions=None)
    vocab = tokenizer.vocab_size
    sample = reads_for(planner, vocab, 0, 1)[0]
    results: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "build_s": build_s,
        "prompt_tokens": len(sample.prompt_ids),
        "prefix_tokens": sample.prefix_length,
        "canvas_tokens": len(sample.canvas_ids),
        "memory_gb": torch.cuda.memory_allocated() / 1e9,
        "kernels": {},
    }
    print(json.dumps({k: v for k, v in results.items() if k != "kernels"}), flush=True)

    naive = NaiveReader(model)
    sequence = 1000
    for kernel in kernels:
        model.set_experts_implementation(kernel)
        reader = InProcessReader(FusedRunner(model, cuda_graphs=True))
        entry: dict[str, Any] = {}
        # Agreement with the naive path on one request (bf16: loose tolerance).
        check = reads_for(planner, vocab, 7, 1)
        fused_out = reader.read(check)[0]
        naive_out = naive.read(check)[0]
        entry["max_abs_prob_diff_vs_naive"] = max(
            max(
                abs(a - b)
                for a, b in zip(
                    slot_reading(f.label_logprobs).probabilities,
                    slot_reading(n.label_logprobs).probabilities,
                    strict=True,
                )
            )
            for f, n in zip(fused_out, naive_out, strict=True)
        )
        reader.read(reads_for(planner, vocab, sequence, 3))  # warm the prefix cache and the kernels
        sequence += 3
        singles = []
        for _ in range(30):
            batch = reads_for(planner, vocab, sequence, 1)
            sequence += 1
            singles.append(timed(lambda b=batch, r=reader: r.read(b)))
        entry["fused_batch1_ms"] = {
            "p50": statistics.median(singles),
            "min": min(singles),
            "p90": statistics.quantiles(singles, n=10)[8],
        }
        batches = {}
        for size in (8, 32, 64, 128, 256):
            times = []
            for _ in range(4):
                batch = reads_for(planner, vocab, sequence, size)
                sequence += size
                times.append(timed(lambda b=batch, r=reader: r.read(b)))
            median = statistics.median(times[1:])
            batches[str(size)] = {
                "ms": median,
                "reads_per_s": size * 1000.0 / median,
                "decisions_per_s": 3 * size * 1000.0 / median,
            }
            print(kernel, size, round(median, 1), "ms", round(3 * size * 1000.0 / median), "decisions/s", flush=True)
        entry["fused_batches"] = batches
        naive_times = []
        for _ in range(8):
            batch = reads_for(planner, vocab, sequence, 1)
            sequence += 1
            naive_times.append(timed(lambda b=batch: naive.read(b)))
        entry["naive_batch1_ms"] = {"p50": statistics.median(naive_times[1:]), "min": min(naive_times)}
        entry["reader_counters"] = dict(reader.counters())
        results["kernels"][kernel] = entry
        print(kernel, json.dumps({k: v for k, v in entry.items() if k != "fused_batches"}), flush=True)
    results["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    with open(out, "w") as handle:
        json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
