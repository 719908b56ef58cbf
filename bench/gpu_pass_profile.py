"""Where a served pass's time goes: the engine as the server builds it (compiled pieces, CUDA graphs), no HTTP.

Usage (on a GPU machine, from the repository root, after `source bench/gpu_setup.sh`):
    python3 bench/gpu_pass_profile.py MODEL_FOLDER OUT_DIR [VARIANT ...]

VARIANT is `served` (the default: the engine as `canvasread serve` builds it),
`grouped` (the same with no flat passes: every pass attends in groups, its
layers' pieces replayed between eager attention, as before flat passes) or
`experts-eager` (the routed experts left out of the compiled pieces: ATen's
kernels, still inside the CUDA graphs) or `tight` (attention groups padded to
at most 1.25 times their real query-key pairs instead of 2: more groups, less
padding computed; it moves only passes too large to attend flat) or `math`
(SDPA's math backend, a matrix product, a softmax and another product,
instead of the memory-efficient kernel, in flat and grouped passes alike) or
`one-tile` (the start-up chooses between the grouped GEMM and the expert
kernel's first tile only, as before the kernel had candidate tiles) or
`separate` (a layer's queries, keys and values, and its dense MLP's gate and
up, each their own product again, as before they were merged). A variant
named again runs again, as NAME-2 (and so on): an A B A B order shows
whether the second engine in a process runs slower than the first. Each variant warms a fresh engine on
the one loaded model and gets a folder of its own.

1. The pass floor: one pass of random canvas rows at each token bucket up to
   2,048 (GPU-synchronised wall time, median of 10): what a pass costs by size.
2. Reads as a server makes them (`fused_reader`, the server's default engine
   settings, random weights): batch-1 `standard`, `mixed` and `steps4` reads
   (fresh requests, median of 20) and a batch of 32 `standard` requests, each with
   the engine's passes and tokens per read.
3. torch.profiler over one batch-1 and one batch-32 `standard` read (and a
   batch-1 `mixed` and `steps4` read), with the
   runner's stages labelled (layout, embedding, graph replays, attention,
   head), so the tables split each read's wall time into host stages, and
   GPU busy time against wall time says whether the pass waits on the host.
   A Chrome trace of each is saved gzipped.
"""

from __future__ import annotations

import gc
import gzip
import json
import logging
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from gpu_runner import Requests, timed_ms
from torch.nn.attention import SDPBackend

from canvasread.backends.base import never_gone
from canvasread.canvas.engine import experts as experts_module
from canvasread.canvas.engine import layers as layers_module
from canvasread.canvas.engine import layout as layout_module
from canvasread.canvas.engine import runner as runner_module
from canvasread.canvas.engine.experts import routed_experts
from canvasread.canvas.engine.factory import fused_reader
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import InProcessReader
from canvasread.canvas.engine.rows import NO_PAST, Row
from canvasread.canvas.engine.settings import Buckets, EngineSettings
from canvasread.canvas.engine.works import ReadWork
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.mixed import mixed_body
from canvasread.tools.workloads import standard_body, steps_body

LABELLED = {
    "stack": ("embed_into", "attend", "attend_flat"),
    "head": ("label_logprobs",),
    "runner": ("_piece", "_flat"),
}


def pass_floor(reader: InProcessReader) -> dict[str, float]:
    """Median ms of one pass of canvas rows (at most 256 tokens each, no past) at each bucket up to 2,048, over
    the reader's store (canvas rows write only to its scratch slot; the flat passes' graphs use that store)."""
    runner, vocab = reader.runner, reader.runner.head.vocab
    floor = {}
    for bucket in [size for size in runner.buckets.tokens if size <= 2048]:
        sizes = [256] * (bucket // 256) + [bucket % 256]
        rows = [Row(NO_PAST, torch.randint(3, vocab, (n,)).tolist(), None, (0,), ((5, 6),)) for n in sizes if n]
        times = [timed_ms(lambda r=rows: runner.run(r, reader.store)) for _ in range(12)]  # type: ignore[misc]
        floor[str(bucket)] = statistics.median(times[2:])
        print("pass", bucket, round(floor[str(bucket)], 2), "ms", flush=True)
    return floor


def timed_reads(reader: InProcessReader, fresh: Requests, make: Callable[[int], dict[str, Any]], size: int) -> dict:
    """Median ms of reads of `size` fresh requests, with the engine's passes and tokens per read."""
    before = dict(reader.counters())
    times, runs = [], 20 if size == 1 else 6
    for _ in range(runs):
        batch = fresh.reads(size, make)
        times.append(timed_ms(lambda b=batch: reader.read(b)))  # type: ignore[misc]
    after = dict(reader.counters())
    passes = (after["passes"] - before["passes"]) / runs
    tokens = (after["pass_tokens"] - before["pass_tokens"]) / runs
    result = {"p50_ms": statistics.median(times[2:]), "min_ms": min(times), "passes_per_read": passes}
    result["tokens_per_read"] = tokens
    print(make.__name__, size, json.dumps(result), flush=True)
    return result


@contextmanager
def labelled(reader: InProcessReader) -> Iterator[None]:
    """The runner's stages wrapped in profiler labels (instance attributes, removed afterwards)."""
    runner = reader.runner
    owners = {"stack": runner.stack, "head": runner.head, "runner": runner}
    original_lay_out = runner_module.lay_out
    for owner, names in LABELLED.items():
        for name in names:
            method = getattr(owners[owner], name)

            def wrapped(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
                with torch.profiler.record_function(f"stage:{_name}"):
                    return _method(*args, **kwargs)

            setattr(owners[owner], name, wrapped)

    def lay_out(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("stage:lay_out"):
            return original_lay_out(*args, **kwargs)

    runner_module.lay_out = lay_out  # type: ignore[assignment]
    try:
        yield
    finally:
        runner_module.lay_out = original_lay_out
        for owner, names in LABELLED.items():
            for name in names:
                delattr(owners[owner], name)


def gpu_busy_ms(prof: Any) -> tuple[float, float]:
    """(GPU busy ms, the union of kernel intervals; span ms from the first kernel's start to the last's end)."""
    spans = sorted(
        (event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / 1000.0, (spans[-1][1] - spans[0][0]) / 1000.0 if spans else 0.0


@torch.inference_mode()
def on_this_thread(reader: InProcessReader, batch: list[CanvasRead]) -> None:
    """The engine core's cycles for one read, run here (the profiler sees the thread that started it)."""
    core = reader.loop.core
    work = ReadWork(batch, never_gone)
    core.cycle([work])
    while not core.idle:
        core.cycle([])
    work.wait()


def profiled(reader: InProcessReader, batch: list[CanvasRead], out: Path, name: str) -> dict[str, Any]:
    with labelled(reader):
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            on_this_thread(reader, batch)
            torch.cuda.synchronize()
        wall = (time.perf_counter() - started) * 1000.0
    averages = prof.key_averages()
    # Each stage label is listed twice, its host range and its GPU range: keep the larger of each time.
    stages: dict[str, dict[str, float]] = {}
    for event in averages:
        if event.key.startswith("stage:"):
            stage = stages.setdefault(event.key, {"calls": event.count, "cpu_total_ms": 0.0, "gpu_span_ms": 0.0})
            stage["cpu_total_ms"] = max(stage["cpu_total_ms"], event.cpu_time_total / 1000.0)
            stage["gpu_span_ms"] = max(stage["gpu_span_ms"], event.device_time_total / 1000.0)
    tables = averages.table(sort_by="cuda_time_total", row_limit=30)
    tables += "\n\n" + averages.table(sort_by="self_cpu_time_total", row_limit=20)
    (out / f"profile_{name}.txt").write_text(tables)
    trace = out / f"trace_{name}.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as source, gzip.open(f"{trace}.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    trace.unlink()
    busy, span = gpu_busy_ms(prof)
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    result = {"wall_ms_profiled": wall, "gpu_busy_ms": busy, "gpu_span_ms": span, "kernels": kernels}
    result["stages"] = stages
    print(name, json.dumps(result), flush=True)
    return result


def measure(reader: InProcessReader, fresh: Requests, out: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"pass_floor_ms": pass_floor(reader)}
    reader.read(fresh.reads(4, standard_body))  # the standard questions' prefix enters the cache
    reader.read(fresh.reads(16, mixed_body))
    report["standard_1"] = timed_reads(reader, fresh, standard_body, 1)
    report["standard_32"] = timed_reads(reader, fresh, standard_body, 32)
    report["mixed_1"] = timed_reads(reader, fresh, mixed_body, 1)
    report["steps4_1"] = timed_reads(reader, fresh, steps_body, 1)
    report["profile_standard_1"] = profiled(reader, fresh.reads(1, standard_body), out, "standard_1")
    report["profile_standard_32"] = profiled(reader, fresh.reads(32, standard_body), out, "standard_32")
    report["profile_mixed_1"] = profiled(reader, fresh.reads(1, mixed_body), out, "mixed_1")
    report["profile_steps4_1"] = profiled(reader, fresh.reads(1, steps_body), out, "steps4_1")
    report["counters"] = dict(reader.counters())
    return report


def separate_products(self: layers_module.Merged, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each merged linear's own product (the `separate` variant), as the engine ran them before merging."""
    sizes = list(self.sizes)
    biases = [None] * len(sizes) if self.bias is None else list(self.bias.split(sizes))
    return tuple(F.linear(x, weight, bias) for weight, bias in zip(self.weight.split(sizes), biases, strict=True))


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    variants = sys.argv[3:] or ["served"]
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("canvasread").setLevel(logging.INFO)  # the start-up's choice of expert products
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    started = time.perf_counter()
    loaded = load_checkpoint(folder, random_init_std=0.02, experts="grouped_mm")
    report["load_s"] = time.perf_counter() - started
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(loaded.model.config.canvas_length), max_positions=None)
    fresh = Requests(planner, tokenizer.vocab_size)
    padding, kernels = layout_module.GROUP_PADDING, layers_module.ATTENTION_KERNELS
    candidates, merged_products = experts_module.CANDIDATES, layers_module.Merged.__call__
    runs: dict[str, int] = {}
    for name in variants:
        runs[name] = runs.get(name, 0) + 1
        key = name if runs[name] == 1 else f"{name}-{runs[name]}"
        experts_module.CANDIDATES = candidates[:1] if name == "one-tile" else candidates
        layers_module.Merged.__call__ = separate_products if name == "separate" else merged_products  # type: ignore[method-assign]
        # `experts-eager`: the routed experts outside the compiled piece (ATen's kernels, in the graphs)
        routed = torch.compiler.disable(routed_experts) if name == "experts-eager" else routed_experts
        layers_module.routed_experts = routed  # type: ignore[attr-defined]
        layout_module.GROUP_PADDING = 1.25 if name == "tight" else padding
        layers_module.ATTENTION_KERNELS = {
            "math": [SDPBackend.MATH],
            "cudnn": [SDPBackend.CUDNN_ATTENTION, *kernels],
        }.get(name, kernels)
        started = time.perf_counter()
        buckets = Buckets(flat_tokens=0) if name == "grouped" else Buckets()
        reader = fused_reader(loaded, EngineSettings(random_init_std=0.02, experts="grouped_mm", buckets=buckets))
        print(key, "warmed in", round(time.perf_counter() - started), "s", flush=True)
        (out / key).mkdir(parents=True, exist_ok=True)
        report[key] = {"warm_up_s": time.perf_counter() - started, **measure(reader, fresh, out / key)}
        (out / "pass_profile.json").write_text(json.dumps(report, indent=2) + "\n")
        del reader
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
