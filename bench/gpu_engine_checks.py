"""Issue 24's GPU checks: later denoising steps replay the graphs exactly, and engine thoughts are `generate`'s.

Usage: PYTHONPATH=src python3 bench/gpu_engine_checks.py MODEL_FOLDER OUT.json

1. Graphed later steps (full-size model, random weights, bf16, compiled pieces): a later step is a pass whose
   self-conditioning signal is an input. The same pass with the same signal, replayed from CUDA graphs (a flat
   pass's whole graph), run from the same compiled pieces without graphs, and attending in groups, must agree
   (target 1e-5 in the probabilities; log-probabilities are compared where a label holds more than 1e-3 of the
   mass, bf16's tail being whole nats wide), and the signal must move the answer (a graph that had captured a
   constant signal would not). Whole `steps: 4` reads are compared too; their draws follow the logits, so
   rounding can move a sample: reported, not held.
2. Thoughts (the full-width config cut to 4 layers, fp32): `EngineThinker` against transformers' `generate`
   (`GenerateThinker`) for the same prompts and seeds, token for token; and one full-size bf16 `think: 32`
   written alone, timed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from canvasread.canvas.engine.kvstore import KVStore
from canvasread.canvas.engine.loader import load_checkpoint
from canvasread.canvas.engine.reader import EngineThinker, InProcessReader
from canvasread.canvas.engine.rows import NO_PAST, Row
from canvasread.canvas.engine.runner import FusedRunner
from canvasread.canvas.engine.settings import Buckets
from canvasread.canvas.engine.thinker import GenerateThinker
from canvasread.canvas.engine.weights import initialise_weights
from canvasread.canvas.plan import Planner
from canvasread.canvas.reader import CanvasRead
from canvasread.canvas.thinker import ThoughtChannel, ThoughtRequest
from canvasread.canvas.tokenizer import HFTokenizer
from canvasread.tools.workloads import planned_reads, steps_body

# The GPU; a CPU only to try the script out on a shrunk config (CANVASREAD_CHECK_DEVICE=cpu).
DEVICE = os.environ.get("CANVASREAD_CHECK_DEVICE", "cuda")
# Small buckets: the reads here are a few standard requests, and capturing fewer buckets saves device time.
CHECK_BUCKETS = Buckets((16, 32, 64, 128, 256, 512, 1024, 2048))
# Labels a random-weight model gives almost no mass: their log-probabilities are far down the bf16 tail, where
# rounding moves them by whole nats while their probabilities move by nothing; the log-probability check skips them.
MEANINGFUL_LOGPROB = math.log(1e-3)
# Which checks run (CANVASREAD_CHECKS=graphed,think to leave out the fp32 thoughts): all by default.
CHECKS = set(os.environ.get("CANVASREAD_CHECKS", "thoughts,graphed,think").split(","))


def probabilities(results: list[Any]) -> list[float]:
    return [p for result in results for slot in result for p in torch.tensor(slot.label_logprobs).exp().tolist()]


def signalled_pass(runner: FusedRunner, store: KVStore, signal: torch.Tensor | None, seed: int = 0) -> list[float]:
    """One pass of a prompt row and a canvas row self-conditioned on `signal` (a later step's input): the canvas
    row's label log-probabilities. Fixed ids from `seed`; the prompt is written to the same slots of `store`."""
    generator = torch.Generator().manual_seed(seed)
    vocab = runner.head.vocab
    prompt = torch.randint(3, vocab, (200,), generator=generator).tolist()
    canvas = torch.randint(3, vocab, (32,), generator=generator).tolist()
    slots = torch.arange(len(prompt), dtype=torch.int64)
    labels = tuple((5 + k, 6 + k, 7 + k) for k in range(4))
    rows = [
        Row(NO_PAST, prompt, slots),
        Row(slots, canvas, None, (1, 9, 17, 25), labels, (), signal, False),
    ]
    return [value for t in runner.run(rows, store)[1].label_logprobs for value in t.tolist()]


def graphed_steps(loaded: Any, reads: list[CanvasRead]) -> dict[str, Any]:
    """A later step is a pass whose self-conditioning signal is an input: the same pass with the same signal,
    replayed from graphs (the pass is small: one flat pass's whole graph) and run flat without them (the same
    compiled pieces), must agree; a constant captured in the graph would show as the signal changing nothing.
    The same pass attending in groups (piecewise graphs between eager attention) must agree too. Also whole
    4-step reads (each step's draws follow its logits, so bf16 rounding can move a sample and everything after
    it: reported, not held to 1e-5)."""
    runners, stores = {}, {}
    variants = (("graphs", True, True), ("compiled", False, True), ("grouped", True, False))
    for name, graphs, flat in variants:
        runner = FusedRunner(loaded.model, cuda_graphs=graphs, compile="inductor", buckets=CHECK_BUCKETS, flat=flat)
        runner.warm_up()
        stack = runner.stack
        dtype = stack.embed.weight.dtype
        stores[name] = KVStore(stack.kv_shapes(), pages=16, page=16, dtype=dtype, device=stack.device)
        runner.capture_flat(stores[name])
        runners[name] = runner
    width = loaded.model.config.text_config.hidden_size
    signal = torch.randn(32, width, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16) * 0.05
    graphed = signalled_pass(runners["graphs"], stores["graphs"], signal)
    plain = signalled_pass(runners["compiled"], stores["compiled"], signal)
    grouped = signalled_pass(runners["grouped"], stores["grouped"], signal)
    unsignalled = signalled_pass(runners["graphs"], stores["graphs"], None)
    flat_replays = runners["graphs"].counters().get("graph_replays", 0)
    reads_graphed = probabilities(InProcessReader(runners["graphs"], cache_bytes=4 << 30).read(reads))
    reads_plain = probabilities(InProcessReader(runners["compiled"], cache_bytes=4 << 30).read(reads))
    held = [(a, b) for a, b in zip(graphed, plain, strict=True) if max(a, b) > MEANINGFUL_LOGPROB]
    return {
        "signalled_pass_max_abs_logprob_diff": max(abs(a - b) for a, b in zip(graphed, plain, strict=True)),
        "signalled_pass_max_abs_probability_diff": max(
            abs(math.exp(a) - math.exp(b)) for a, b in zip(graphed, plain, strict=True)
        ),
        "signalled_pass_max_abs_logprob_diff_above_1e-3": max((abs(a - b) for a, b in held), default=0.0),
        "flat_against_grouped_max_abs_probability_diff": max(
            abs(math.exp(a) - math.exp(b)) for a, b in zip(graphed, grouped, strict=True)
        ),
        "graph_replays_of_the_signalled_passes": flat_replays,
        "signalled_pass_labels": len(graphed),
        "signalled_pass_labels_above_1e-3": len(held),
        "signal_moves_logprobs_by": max(abs(a - b) for a, b in zip(graphed, unsignalled, strict=True)),
        "steps4_reads_max_abs_probability_diff": max(
            abs(a - b) for a, b in zip(reads_graphed, reads_plain, strict=True)
        ),
        "graph_replays": runners["graphs"].counters().get("graph_replays", 0),
        "flat_passes": runners["graphs"].counters()["flat_passes"],
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

    if "thoughts" in CHECKS:
        report["thoughts_fp32_4_layers"] = thoughts_fp32(folder)
        print("thoughts fp32:", report["thoughts_fp32_4_layers"], flush=True)
        save()
    loaded = load_checkpoint(folder, device=DEVICE, random_init_std=0.02, experts="grouped_mm")
    tokenizer = HFTokenizer(loaded.tokenizer)
    planner = Planner(tokenizer, canvas_length=int(loaded.model.config.canvas_length), max_positions=None)
    reads = planned_reads(planner, [steps_body(n) for n in range(8)], tokenizer.vocab_size)
    if "graphed" in CHECKS:
        report["graphed_steps_bf16"] = graphed_steps(loaded, reads)
        print("graphed steps:", report["graphed_steps_bf16"], flush=True)
        save()
    if "think" in CHECKS:
        report["think_bf16"] = think_alone(loaded, tokenizer)
        print("think:", report["think_bf16"], flush=True)
        save()


if __name__ == "__main__":
    main()
