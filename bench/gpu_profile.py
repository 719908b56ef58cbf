"""Where the time goes, and whether bf16 disagreement is numerics: run on a GPU machine.

Usage: PYTHONPATH=src python3 bench/gpu_profile.py MODEL_FOLDER OUT_DIR

1. fp32 check: the full-width config cut to 4 layers, random weights, fp32 on
   the GPU: fused engine vs plain transformers forward (should agree to ~1e-5;
   the full bf16 model diverges because random-weight MoE routing flips on
   rounding-level differences).
2. torch.profiler tables for one fused pass at batch 1 and batch 64 on the
   full-size bf16 model with compiled layer bodies and no CUDA graphs (so the
   kernels show), top kernels by GPU time, top ops by CPU time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.naive import NaiveReader
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.weights import initialise_weights
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.workloads import planned_reads, standard_body


def reads_for(planner: Planner, vocab: int, start: int, count: int) -> list[CanvasRead]:
    return planned_reads(planner, [standard_body(n) for n in range(start, start + count)], vocab)


def fp32_check(folder: str) -> float:
    config = DiffusionGemmaConfig.from_pretrained(folder)
    text = config.text_config
    text.num_hidden_layers = 4
    text.layer_types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    with torch.device("cuda"):
        model = DiffusionGemmaForBlockDiffusion(config).float().eval()
    initialise_weights(model, std=0.02)
    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder))
    planner = Planner(tokenizer, canvas_length=int(config.canvas_length), max_positions=None)
    reads = reads_for(planner, tokenizer.vocab_size, 3, 2)
    fused = InProcessReader(FusedRunner(model)).read(reads)
    naive = NaiveReader(model).read(reads)
    worst = 0.0
    for f_read, n_read in zip(fused, naive, strict=True):
        for f, n in zip(f_read, n_read, strict=True):
            worst = max(worst, max(abs(a - b) for a, b in zip(f.label_logprobs, n.label_logprobs, strict=True)))
    del model
    torch.cuda.empty_cache()
    return worst


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    worst = fp32_check(folder)
    print(f"fp32 4-layer check: max |logprob fused - naive| = {worst:.2e}", flush=True)
    loaded = load_checkpoint(folder, random_init_std=0.02, experts="grouped_mm")
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(loaded.model.config.canvas_length), max_positions=None)
    reader = InProcessReader(FusedRunner(loaded.model, compile="inductor"))
    reader.read(reads_for(planner, tokenizer.vocab_size, 0, 4))
    report = {"fp32_4_layer_max_abs_logprob_diff": worst}
    for size, start in ((1, 100), (64, 200)):
        reader.read(reads_for(planner, tokenizer.vocab_size, start + 1000, size))
        batch = reads_for(planner, tokenizer.vocab_size, start, size)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            reader.read(batch)
            torch.cuda.synchronize()
        averages = prof.key_averages()
        by_gpu = averages.table(sort_by="cuda_time_total", row_limit=22)
        by_cpu = averages.table(sort_by="self_cpu_time_total", row_limit=12)
        (out / f"profile_batch{size}.txt").write_text(by_gpu + "\n\n" + by_cpu)
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        report[f"batch{size}_kernels"] = kernels
        print(f"=== batch {size}: {kernels} GPU kernels", flush=True)
        print(by_gpu[:6000], flush=True)
    (out / "profile.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
