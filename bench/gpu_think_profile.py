"""Where a thought's time goes: one full-size bf16 `think: 32` written by the engine, timed piece by piece.

Usage on the GPU machine: PYTHONPATH=src python3 bench/gpu_think_profile.py MODEL_FOLDER OUT_DIR

A thought is a denoising pass a step, then the step's draw between passes. The engine's pass counter times
the runner's host side only (a pass without label slots returns before the GPU has finished it), so this script
times each piece of the loop on the host (wrapping the engine's methods from outside, nothing changed in the
package) and records the GPU's kernels under torch.profiler: what the GPU did, what the host did, and what
neither did. Writes OUT_DIR/think-profile.json and the profiler's tables (think-profile.txt).
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from gpu_engine_checks import CHECK_BUCKETS, thought_requests

from canvasread.canvas.engine import core, generation, heads, runner
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import EngineThinker, InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.tokenizer import HFTokenizer

# A CPU only to try the script out on a tiny checkpoint (no graphs, no compile, no CUDA activity).
CUDA = torch.cuda.is_available()
HOST_SECONDS: dict[str, list[float]] = defaultdict(list)


def timed(owner: Any, name: str, label: str) -> None:
    """Replace owner.name by a wrapper that records its host wall time under `label`."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            with torch.profiler.record_function(label):
                return original(*args, **kwargs)
        finally:
            HOST_SECONDS[label].append(time.perf_counter() - started)

    setattr(owner, name, wrapper)


def instrument() -> None:
    timed(runner.FusedRunner, "run", "runner.run")
    timed(runner, "lay_out", "layout.lay_out")
    timed(heads.SlotHead, "scaled", "head.scaled")
    timed(generation.Generation, "advance", "generation.advance")
    timed(generation, "draw", "sampling.draw")
    timed(generation.Generation, "stops", "generation.stops")
    timed(generation.Generation, "canvas_ids", "generation.canvas_ids")
    timed(core.EngineCore, "_queues", "core._queues")
    timed(core, "pack", "scheduler.pack")
    timed(core.EngineCore, "cycle", "core.cycle")


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_checkpoint(folder, random_init_std=0.02 if CUDA else None, experts="grouped_mm" if CUDA else None)
    tokenizer = HFTokenizer(loaded.tokenizer)
    fused = FusedRunner(loaded.model, cuda_graphs=CUDA, compile="inductor" if CUDA else None, buckets=CHECK_BUCKETS)
    fused.warm_up()
    reader = InProcessReader(fused, cache_bytes=4 << 30)
    thinker = EngineThinker(reader)
    made = thought_requests(tokenizer, 6, 32)
    walls = []
    for request in made[:3]:  # warm: the first thought allocates, later ones show the steady state
        started = time.perf_counter()
        thinker.think([request])
        walls.append(time.perf_counter() - started)
    instrument()
    before = dict(reader.counters())
    started = time.perf_counter()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if CUDA:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        for request in made[3:5]:
            thinker.think([request])
        if CUDA:
            torch.cuda.synchronize()
    profiled = time.perf_counter() - started
    after = dict(reader.counters())
    HOST_SECONDS.clear()
    started = time.perf_counter()
    thinker.think([made[5]])
    plain = time.perf_counter() - started
    steps = after["denoising_steps"] - before["denoising_steps"]
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_busy = sum(e.device_time_total for e in kernels) / 1e6
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if CUDA else "cpu",
        "warm_thoughts_s": walls,
        "instrumented_thought_s": plain,
        "profiled_two_thoughts_s": profiled,
        "profiled_passes": after["passes"] - before["passes"],
        "profiled_denoising_steps": steps,
        "profiled_kernels": len(kernels),
        "profiled_gpu_kernel_s": gpu_busy,
        "host_s_per_call_last_thought": {k: statistics.fmean(v) for k, v in HOST_SECONDS.items()},
        "host_calls_last_thought": {k: len(v) for k, v in HOST_SECONDS.items()},
        "host_total_s_last_thought": {k: sum(v) for k, v in HOST_SECONDS.items()},
    }
    (out / "think-profile.json").write_text(json.dumps(report, indent=2))
    averages = profile.key_averages()
    tables = [
        averages.table(sort_by="cuda_time_total", row_limit=40),
        averages.table(sort_by="self_cpu_time_total", row_limit=30),
        averages.table(sort_by="cpu_time_total", row_limit=30),
    ]
    (out / "think-profile.txt").write_text("\n\n".join(tables))
    print(json.dumps(report, indent=2), flush=True)
    print(tables[0][:5000], flush=True)


if __name__ == "__main__":
    main()
