"""`EngineSettings`: how an in-process DiffusionGemma checkpoint is run (the `serve` flags for it).

None picks the best the machine has. No torch here, so the CLI can build and
check settings before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes of encoded prompts kept for reuse across requests (the LRU prefix cache): ~2 GB holds thousands of
# system turns of the full-size model and is small beside its ~50 GB of weights.
DEFAULT_CACHE_BYTES = 2 << 30
# Rows (canvas reads) in one forward pass at most; larger batches are split.
DEFAULT_MAX_ROWS = 256


@dataclass(frozen=True)
class EngineSettings:
    """How checkpoints are run in process.

    `random_init_std` builds the model from the folder's config with random
    weights (speed tests without the checkpoint); `naive_baseline` also serves
    `<model>-naive`, plain transformers forwards on the same weights; `gpus`
    places one replica on each of `cuda:0..N-1`. On CUDA, `compile` runs each
    layer body through `torch.compile` and the common shapes are compiled and
    captured at start-up; `fp8_experts` runs the routed experts in FP8 with
    rowwise scales (opt-in: it changes the answers slightly, see the README).
    `experts` picks transformers' kernel for the naive baseline only.
    """

    device: str | None = None
    dtype: str | None = None
    experts: str | None = None
    random_init_std: float | None = None
    naive_baseline: bool = False
    gpus: int = 1
    cuda_graphs: bool = True
    # Fuses the fp32 norm chains, rotary and routing (about half the GPU time of an eager pass); on by default.
    compile: bool = True
    # Off by default: FP8 halves the experts' bytes but is not exact (mean KL and agreement in bench results).
    fp8_experts: bool = False
    cache_bytes: int = DEFAULT_CACHE_BYTES
    max_rows: int = DEFAULT_MAX_ROWS

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus must be at least 1")
        if self.gpus > 1 and self.device is not None:
            raise ValueError("--gpus places one replica on each of cuda:0..N-1; leave --device out")
        if self.cache_bytes < 0 or self.max_rows < 1:
            raise ValueError("cache_bytes must be >= 0 and max_rows >= 1")
