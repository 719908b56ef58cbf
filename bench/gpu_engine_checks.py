"""Issue 24's GPU checks: later denoising steps replay the graphs exactly, and engine thoughts are `generate`'s.

Usage: PYTHONPATH=src python3 bench/gpu_engine_checks.py MODEL_FOLDER OUT.json

1. Graphed later steps (full-size model, random weights, bf16, compiled pieces): the same `steps: 4` reads of
   standard requests through a runner that replays CUDA graphs and through one that runs the same compiled
   pieces without graphs. The self-conditioning of steps 2-4 is an input of the graphed pass, so the two must
   agree to float noise (target 1e-5 relative on the slot probabilities); a graph that had captured a constant
   signal would differ by whole units. Also the difference to plain eager pieces (other kernels: bf16 noise).
2. Thoughts (the full-width config cut to 4 layers, fp32): `EngineThinker` against transformers' `generate`
   (`GenerateThinker`) for the same prompts and seeds, token for token; and one full-size bf16 `think: 32`
   written alone, timed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import EngineThinker, InProcessReader
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import Buckets
from canvasread.canvas.engine.thinker import GenerateThinker
from canvasread.canvas.engine.weights import initialise_weights
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.thinker import ThoughtChannel, ThoughtRequest
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.bench import planned_reads, steps_body

# The GPU; a CPU only to try the script out on a shrunk config (CANVASREAD_CHECK_DEVICE=cpu).
DEVICE = os.environ.get("CANVASREAD_CHECK_DEVICE", "cuda")
# Small buckets: the reads here are a few standard requests, and capturing fewer buckets saves device time.
CHECK_BUCKETS = Buckets((16, 32, 64, 128, 256, 512, 1024, 2048))


def probabilities(results: list[Any]) -> list[float]:
    return [p for result in results for slot in result for p in torch.tensor(slot.label_logprobs).exp().tolist()]


def relative(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b, strict=True))


def graphed_steps(loaded: Any, reads: list[CanvasRead]) -> dict[str, Any]:
    results = {}
    for name, graphs, compiled in (
        ("graphs", True, "inductor"),
        ("compiled", False, "inductor"),
        ("eager", False, None),
    ):
        runner = FusedRunner(loaded.model, cuda_graphs=graphs, compile=compiled, buckets=CHECK_BUCKETS)
        runner.warm_up()
        reader = InProcessReader(runner, cache_bytes=4 << 30)
        results[name] = probabilities(reader.read(reads))
        results[f"{name}_passes"] = reader.counters()["passes"]
        results[f"{name}_graph_replays"] = reader.counters().get("graph_replays", 0)
    return {
        "graphs_vs_compiled_max_rel": relative(results["graphs"], results["compiled"]),
        "graphs_vs_eager_max_rel": relative(results["graphs"], results["eager"]),
        "graph_replays": results["graphs_graph_replays"],
        "passes": results["graphs_passes"],
        "reads": len(reads),
    }


def thought_requests(tokenizer: HFTokenizer, count: int, tokens: int) -> list[ThoughtRequest]:
    channel = ThoughtChannel.of(tokenizer)
    assert channel is not None
    requests = []
    for n in range(count):
        text = f"<bos><|turn>user\nTicket {n}: charged twice for order {1180 + n}.<turn|>\n<|turn>model\n"
        ids = tokenizer.encode(text + "<|channel>thought\n")
        requests.append(ThoughtRequest(tuple(ids), tokens, channel.stop_ids, seed=n))
    return requests


def thoughts_fp32(folder: str) -> dict[str, Any]:
    config = DiffusionGemmaConfig.from_pretrained(folder)
    text = config.text_config
    if text.num_hidden_layers > 4:
        text.num_hidden_layers = 4
        text.layer_types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    with torch.device(DEVICE):
        model = DiffusionGemmaForBlockDiffusion(config).float().eval()
    initialise_weights(model, std=0.02)
    model.generation_config.max_denoising_steps = 8  # a few passes a block: the check, not the speed
    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder))
    requests = thought_requests(tokenizer, 4, 40)
    engine = EngineThinker(InProcessReader(FusedRunner(model), cache_bytes=2 << 30))
    reference = GenerateThinker(model, pad_id=tokenizer.pad_id)
    same = total = 0
    exact = []
    for request in requests:
        [ours] = engine.think([request])
        [theirs] = reference.think([request])
        assert ours is not None and theirs is not None
        total += max(len(ours.token_ids), len(theirs.token_ids))
        same += sum(a == b for a, b in zip(ours.token_ids, theirs.token_ids, strict=False))
        exact.append(ours.token_ids == theirs.token_ids)
    del model, engine, reference
    torch.cuda.empty_cache()
    return {"thoughts_token_for_token": exact, "token_agreement": same / max(1, total)}


def think_alone(loaded: Any, tokenizer: HFTokenizer) -> dict[str, Any]:
    runner = FusedRunner(loaded.model, cuda_graphs=True, compile="inductor", buckets=CHECK_BUCKETS)
    runner.warm_up()
    thinker = EngineThinker(InProcessReader(runner, cache_bytes=4 << 30))
    times = []
    for request in thought_requests(tokenizer, 4, 32):
        started = time.monotonic()
        thinker.think([request])
        times.append((time.monotonic() - started) * 1000.0)
    batch = thought_requests(tokenizer, 16, 32)
    started = time.monotonic()
    thinker.think(batch)
    together = time.monotonic() - started
    return {"think32_alone_ms": times, "think32_alone_p50_ms": statistics.median(times[1:]),
            "think32_16_at_once_s": together, "think32_16_at_once_per_s": 16 / together}  # fmt: skip


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    report: dict[str, Any] = {"gpu": gpu, "torch": torch.__version__}

    def save() -> None:
        out.write_text(json.dumps(report, indent=2))

    report["thoughts_fp32_4_layers"] = thoughts_fp32(folder)
    print("thoughts fp32:", report["thoughts_fp32_4_layers"], flush=True)
    save()
    loaded = load_checkpoint(folder, device=DEVICE, random_init_std=0.02, experts="grouped_mm")
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(loaded.model.config.canvas_length), max_positions=None)
    first = planned_reads(planner, [steps_body(n) for n in range(8)], tokenizer.vocab_size)
    reads = [replace(read, steps=4, seed=n) for n, read in enumerate(first)]
    report["graphed_steps_bf16"] = graphed_steps(loaded, reads)
    print("graphed steps:", report["graphed_steps_bf16"], flush=True)
    save()
    report["think_bf16"] = think_alone(loaded, tokenizer)
    print("think:", report["think_bf16"], flush=True)
    save()


if __name__ == "__main__":
    main()
