"""`EngineSettings`: how an in-process DiffusionGemma checkpoint is run (the `serve` flags for it).

None picks the best the machine has. No torch here, so the CLI can build and
check settings before anything heavy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from canvasread.backends.base import MAX_BATCHES_AT_ONCE

# The dtypes `--dtype` takes, each with the name of its torch dtype: spelled here, without torch, so a name the
# engine cannot run in is refused before the port binds; the loader maps them to torch's (`loader.resolve_dtype`).
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
# Bytes of the KV store off a GPU (encoded prompts kept for reuse and the prompts a pass reads); on a GPU
# the store takes a share of the memory left after the weights (`cache_bytes=None`).
DEFAULT_CPU_CACHE_BYTES = 2 << 30
# The token buckets a pass is padded to: every size up to the largest a pass may hold is warmed before
# /ready, so no request ever meets a compile or a capture. Doubling steps keep padding under 2x.
DEFAULT_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# Flat passes (`Buckets.flat_tokens`): up to a lone reader's or thinker's pass (a `standard` read is ~180 tokens, a
# thought's step ~260), over the past keys of a few rows (a cached question prefix and one state each).
DEFAULT_FLAT_TOKENS = 512
DEFAULT_FLAT_PAST = (512, 1024, 2048)
# Rows (canvas reads) in one forward pass at most; larger batches are split.
DEFAULT_MAX_ROWS = 256
# Batches the canvas backend reads at once over one engine: their reads, re-reads and thoughts share the engine
# loop's passes, so a batch's re-read round rides beside the next batch's first reads instead of waiting for it.
# What they hold together stays within one batch's token budget (`BatchSettings.max_batch_tokens`). On a GPU a
# pass costs a floor (every expert's weights read) plus its tokens, so it pays to put every client in one pass:
# closed-loop clients come back one by one in small batches, and with 4 slots the later ones waited for a slot
# and fell a pass behind (on the H200 the passes split into 3 cohorts at 32 clients, 11 requests each). On a CPU
# a pass costs about its tokens, and larger passes read slower: 4.
GPU_BATCHES_IN_FLIGHT = MAX_BATCHES_AT_ONCE
CPU_BATCHES_IN_FLIGHT = 4
# The fraction of the engine's time thoughts may take in passes that read (`scheduler.Share`): the readers' latency
# beside thoughts rises by about this much, and a thought beside reads that keep the engine busy takes up to
# 1/share times as long as alone.
DEFAULT_THOUGHT_SHARE = 0.15


@dataclass(frozen=True)
class Buckets:
    """The engine's one shape policy: the token counts a pass is padded to, the KV store's page size, and which
    passes attend flat.

    A pass holds at most `max_tokens` tokens (longer prompts are encoded in
    chunks over several passes); start-up compiles and captures every bucket,
    and every flat (tokens, past) shape whole.
    """

    tokens: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS
    page: int = 16
    # Passes of at most this many tokens whose rows' past keys fit a `flat_past` bucket attend flat: one attention
    # over the whole pass, so on a GPU the whole pass is one captured graph (its launches cost a graph's, not 30
    # layers' eager attention). Its attention is dense over the pass, so only small passes gain; 0: none.
    flat_tokens: int = DEFAULT_FLAT_TOKENS
    flat_past: tuple[int, ...] = DEFAULT_FLAT_PAST

    def __post_init__(self) -> None:
        for name, sizes in (("token", self.tokens), ("flat past", self.flat_past)):
            if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                raise ValueError(f"{name} buckets must be distinct positive sizes in increasing order")
        if self.page < 1:
            raise ValueError("the page size must be at least 1")
        if self.flat_tokens < 0:
            raise ValueError("the flat pass size must be at least 0")

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    def pad(self, tokens: int) -> int:
        """The smallest bucket that holds `tokens`."""
        for size in self.tokens:
            if size >= tokens:
                return size
        raise ValueError(f"a pass of {tokens} tokens is over the largest bucket, {self.max_tokens}")

    @property
    def flat(self) -> list[tuple[int, int]]:
        """Every (token bucket, past bucket) a flat pass may take: the shapes start-up captures whole."""
        return [(size, past) for size in self.tokens if size <= self.flat_tokens for past in self.flat_past]

    def flat_shape(self, tokens: int, past: int) -> tuple[int, int] | None:
        """The (token bucket, past bucket) of a pass of `tokens` whose rows have `past` past keys in all, when it
        attends flat; None when it attends in groups."""
        bucket = self.pad(tokens)
        if bucket > self.flat_tokens or past > self.flat_past[-1]:
            return None
        return bucket, next(size for size in self.flat_past if size >= past)


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
    # None: on a GPU, 40% of the memory free after loading; elsewhere DEFAULT_CPU_CACHE_BYTES.
    cache_bytes: int | None = None
    max_rows: int = DEFAULT_MAX_ROWS
    buckets: Buckets = field(default_factory=Buckets)
    # Tokens one pass may take (prompt encodings, reads and thoughts together); None: the largest bucket. A
    # smaller pass answers a lone request's steps sooner under load, a larger one reads more per weight load.
    pass_tokens: int | None = None
    # None: GPU_BATCHES_IN_FLIGHT on a GPU, CPU_BATCHES_IN_FLIGHT elsewhere.
    batches_in_flight: int | None = None
    thought_share: float = DEFAULT_THOUGHT_SHARE
    # The engine's loop in a process of its own (`worker.py`: no thread of the server's can hold up its passes);
    # None: on a GPU, where a pass is thousands of short ops, not on a CPU, where starting one costs seconds.
    process: bool | None = None

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus must be at least 1")
        if self.gpus > 1 and self.device is not None:
            raise ValueError("--gpus places one replica on each of cuda:0..N-1; leave --device out")
        if self.dtype is not None:
            torch_dtype_name(self.dtype)
        if self.random_init_std is not None and not (math.isfinite(self.random_init_std) and self.random_init_std >= 0):
            raise ValueError(f"--random-weights must be a finite STD >= 0, not {self.random_init_std:g}")
        if self.cache_bytes is not None and self.cache_bytes < 1:
            raise ValueError("--kv-cache-gib must be positive: a KV store of no bytes holds no request's prompts")
        if self.max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if self.batches_in_flight is not None and not 1 <= self.batches_in_flight <= MAX_BATCHES_AT_ONCE:
            raise ValueError(f"--batches-in-flight must be between 1 and {MAX_BATCHES_AT_ONCE}")
        if not 0.0 <= self.thought_share <= 1.0:
            raise ValueError("--thought-share must be between 0 and 1")
        if self.pass_tokens is not None and not self.buckets.tokens[0] <= self.pass_tokens <= self.buckets.max_tokens:
            raise ValueError(
                f"--pass-tokens must be between the engine's smallest and largest bucket, "
                f"{self.buckets.tokens[0]} and {self.buckets.max_tokens}"
            )

    def batches(self, *, on_gpu: bool) -> int:
        """The batches read at once over one engine on this kind of device (`batches_in_flight`, or its default)."""
        if self.batches_in_flight is not None:
            return self.batches_in_flight
        return GPU_BATCHES_IN_FLIGHT if on_gpu else CPU_BATCHES_IN_FLIGHT


def torch_dtype_name(dtype: str) -> str:
    """The torch dtype a `--dtype` name stands for; a name the engine cannot run in is refused (ValueError)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown --dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]
